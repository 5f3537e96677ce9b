"""Access to the Kubernetes API. Only :mod:`driver.kube.api` imports the
``kubernetes`` client; everything else works on plain JSON dicts."""
