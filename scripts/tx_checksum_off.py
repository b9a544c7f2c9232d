#!/usr/bin/python3
"""Turns off transmit checksum offload of network interfaces (ethtool -K IF tx off, through the
SIOCETHTOOL ioctl, for machines without ethtool): the kernel then writes full UDP checksums, which
a raw receiver (DPDK's net_af_packet, an AF_XDP socket) needs on veth links, where the offload
never happens. Used by the dpdk test scripts and the testbed's kernel-bypass benchmarks.

    tx_checksum_off.py IFNAME [IFNAME ...]
"""
import array
import fcntl
import socket
import struct
import sys

SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17

if len(sys.argv) < 2:
    sys.exit("usage: tx_checksum_off.py IFNAME [IFNAME ...]")
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    for name in sys.argv[1:]:
        value = array.array("B", struct.pack("II", ETHTOOL_STXCSUM, 0))
        ifreq = struct.pack("16sP", name.encode(), value.buffer_info()[0]).ljust(40, b"\0")
        fcntl.ioctl(s, SIOCETHTOOL, ifreq)
