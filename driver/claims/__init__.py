"""Claim handling: the typed view of a kubelet prepare/unprepare call and
the rules that decide which allocation results are ours to prepare."""
