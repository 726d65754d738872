"""SSH test hosts in network namespaces, with stub GPU/HCA/NTP tools (see netns.py)."""
