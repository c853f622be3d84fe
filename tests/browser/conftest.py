"""The browser tests' fixtures (Chromium, a JupyterLab server, a page), shared by each module."""

from tests.browser.test_jupyterlab import chromium, lab, page

__all__ = ["chromium", "lab", "page"]
