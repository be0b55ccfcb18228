"""The node agent: runs on every GPU node, serves its GPUs' readings in dcgm-exporter's names and
forwards the cloud's interruption notices read on the node to the controller."""
