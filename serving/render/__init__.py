"""Pure renderers: a :class:`~serving.plan.model.Fleet` to SGLang and router command lines, systemd units,
chrony.conf, the Ansible inventory and Kubernetes objects (``k8s/``). They never call the planner."""
