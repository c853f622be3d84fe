"""The browser tests' fixtures (Chromium, a JupyterLab server, a page): tests/browser/lab.py."""

from tests.browser.lab import chromium, lab, page

__all__ = ["chromium", "lab", "page"]
