"""Device health: the typed view of what the plugin reports to the kubelet's
DRAResourceHealth stream, and the protocol a health monitor implements."""
