"""The test harness: the real processes the cluster tiers run, started and stopped.

Why a package: the tests, the benchmarks and the CLIs in hack/ (thin entry
points) import it by name (``from tests.harness.cluster import LocalCluster``),
and ``mypy --strict`` checks it with the rest of tests/. Its modules:

- cluster, cluster_proc, cluster_pki, cluster_agent: the local control plane
  (etcd, kube-apiserver, scheduler, controller-manager), its processes, its
  PKI, and the kubelet's DRA manager as a node agent;
- simnode, fabricsim: the plugin on a simulated node, the fabric service and
  the controller as processes;
- realnode, realnode_node, realnode_net, realnode_cgroup, realnode_config,
  realnode_chart: real nodes (kubelet, containerd, runc in namespaces) and
  the chart installed with helm;
- images, image_oci, image_tools: the real-node tier's image archives;
- demo, topology_svg: ``make demo`` and the docs' topology picture.

Importing this package imports nothing outside the standard library, so
``python3 hack/images.py`` runs on the system Python.
"""
