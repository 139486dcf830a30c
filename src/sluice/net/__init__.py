"""The network-stack lab: container datapaths built from network namespaces, measured.

`sluice net bench` makes two "nodes" (network namespaces) on this machine, joins them with
each datapath the kernel supports (host, routed veth, bridge, macvlan, VXLAN overlay), and
measures what training traffic feels: TCP throughput, request/response latency, CPU per GB,
the MTU, gloo all-reduce, a data-parallel job's step time and remote dataset reads.
`recommend` turns the measurements into a datapath per workload (a pure function).

This package imports nothing of the control plane (an import-linter contract); the CLI
calls it, and the job launcher only reads the setting its `--apply` writes.
"""
