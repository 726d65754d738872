"""What pyproject.toml cannot say: the Jinja2 templates live at the top of the repository (``templates/``) and ship
inside the package as ``serving/templates`` (package data, listed in pyproject.toml), where an installed
``serving.render.common`` reads them. Everything else about the build is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["serving", "serving.*"]), "serving.templates"],
    package_dir={"serving.templates": "templates"},
)
