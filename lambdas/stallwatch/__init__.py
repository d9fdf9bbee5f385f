"""Stallwatch's control plane: the Lambda functions' code and the ``stallwatch`` operator CLI."""

__version__ = "0.1.0"
