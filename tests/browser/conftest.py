"""The browser tests' fixtures (Chromium, a JupyterLab server, a page): harness/lab.py."""

from harness.lab import chromium, lab, page

__all__ = ["chromium", "lab", "page"]
