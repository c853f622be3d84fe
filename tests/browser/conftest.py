"""The browser tests' fixtures (Chromium, a JupyterLab server, a page, the frontend's debug
requests' log): harness/lab.py."""

from harness.lab import chromium, dap_log, lab, page

__all__ = ["chromium", "dap_log", "lab", "page"]
