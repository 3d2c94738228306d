"""Libra runtime: everything that touches torch.distributed or a device."""
