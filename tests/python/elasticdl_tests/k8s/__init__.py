"""Test harness for ElasticDL on Kubernetes: a real API server (``cluster``), a fake
process kubelet (``process_kubelet``) and the pytest fixtures wiring them (``conftest``)."""
