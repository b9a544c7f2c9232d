#!/usr/bin/python3
"""Turns off transmit checksum offload of a network interface (ethtool -K IF tx off, through the
SIOCETHTOOL ioctl, for machines without ethtool): the kernel then writes full UDP checksums, which
a raw (af_packet) receiver such as DPDK's net_af_packet needs on veth links."""
import array
import fcntl
import socket
import struct
import sys

SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17

if len(sys.argv) != 2:
    sys.exit("usage: tx_checksum_off.py IFNAME")
value = array.array("B", struct.pack("II", ETHTOOL_STXCSUM, 0))
ifreq = struct.pack("16sP", sys.argv[1].encode(), value.buffer_info()[0]).ljust(40, b"\0")
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    fcntl.ioctl(s, SIOCETHTOOL, ifreq)
