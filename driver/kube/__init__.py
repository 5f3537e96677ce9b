"""Access to the Kubernetes API. Only :mod:`driver.kube.api` talks to the
apiserver, with its own configuration (:mod:`driver.kube.kubeconfig`) and
HTTP client (:mod:`driver.kube.http1`); everything else works on plain JSON
dicts."""
