"""The links a forecast without a run directory uses, resolved from the catalogue (tftoolkit/catalogue/*.toml).

Each term of the communication model, with its source, in one place:

- **Ring bandwidth inside a host** = the link's ``achieved_gbs`` (what an all-reduce reaches in practice, per the
  catalogue's source for that link), else its rated ``gbs``.
- **No peer-to-peer** (``peer_to_peer = false`` in gpus.toml: GeForce cards): GPU-to-GPU traffic is staged through
  host memory, so every byte crosses the host's PCIe root complex twice (GPU -> host, host -> GPU), and the GPUs
  share that root complex: the ring gets half the link's bandwidth. The catalogue's gpus.toml names the source for
  which cards lack peer-to-peer.
- **Topology of a named system** (systems.toml ``nvlink_edges``): NCCL builds its rings over NVLink where the
  GPUs in use are connected in a cycle, several rings at once over disjoint links. For the first G GPUs of a
  hybrid cube-mesh (DGX-1) the rings are found greedily (ring_links); their bandwidth is the links per GPU they
  use together x the NVLink's achieved bandwidth per link.
  Where no cycle of NVLink hops joins the G GPUs, the ring must cross PCIe (``host_link``) for at least one hop,
  and that hop sets the bandwidth. NVSwitch systems: every GPU reaches every other at the full link.
- **One ring in device order** (``ring-in-order``: NCCL 1.x, which TensorFlow 1.x's contrib NCCL all-reduce and
  tf_cnn_benchmarks' 2017 ``replicated`` mode used, ran a single ring (NVIDIA/nccl#43: "NCCL 1.3 was only relying on
  a single ring"), through the GPUs in the communicator's order, which is the device order (unconfirmed: no
  topology search before NCCL 2)). Each hop i -> i+1 takes one NVLink where the system has one between them, else
  PCIe; a hop between GPUs on different CPUs has no peer-to-peer (NCCL itself does not use P2P across the CPUs'
  interconnect unless NCCL_P2P_LEVEL=SYS, its environment documentation says) and is staged through host memory:
  half the PCIe link. The slowest hop sets the ring.
- **Shared uplinks to the host** (``host``, the parameter server in host memory): the GPUs behind one PCIe switch
  (systems.toml ``gpus_per_switch``) or on one board (gpus.toml ``gpus_per_board``, K80) share its x16 link to the
  CPU; uplink_sharing says how many of the first G GPUs do.
- **Between hosts**: the system's (or ``--inter-host``'s) NIC link, ``nics`` NICs per host used together by the
  hierarchical all-reduce (comms.allreduce_time).
- **Latency per ring step**: the link's ``latency_us`` where the catalogue has one, else DEFAULT_LATENCY_US.
"""

from __future__ import annotations

import functools
import itertools

from .. import catalogue
from ..catalogue.reader import GPU, System
from ..errors import ConfigError
from .comms import Link, parse_link

DEFAULT_LATENCY_US = {"pcie": 3.0, "nvlink": 0.6, "nvswitch": 0.6, "infiniband": 9.8, "ethernet": 20.0}
# The same per-step latencies comms.PRESETS carries for PCIe, NVLink and InfiniBand (their sources are listed
# there); Ethernet/RoCE has no published per-step figure in the catalogue: taken at twice InfiniBand's (unconfirmed).


def _known(kind: str) -> str:
    items = {"gpu": catalogue.gpus, "link": catalogue.links, "system": catalogue.systems}[kind]()
    return ", ".join(x.key for x in items)


def find_gpu(name: str) -> GPU:
    try:
        return catalogue.gpu(name)
    except ConfigError:
        raise ConfigError(f"unknown GPU {name!r}; known: {_known('gpu')}") from None


def find_system(name: str) -> System | None:
    """The named system, or None when ``name`` is a link rather than a system."""
    try:
        return catalogue.system(name)
    except ConfigError:
        return None


def ring_link(entry, name: str | None = None, halve: bool = False) -> Link:
    """A catalogue link as the ring sees it: achieved (else rated) bandwidth and its latency; ``halve``: traffic
    staged through host memory (no peer-to-peer)."""
    bw = entry.achieved_gbs or entry.gbs
    if not bw:
        raise ConfigError(f"link {entry.key!r} has no bandwidth in the catalogue")
    lat = entry.latency_us if entry.latency_us is not None else DEFAULT_LATENCY_US.get(entry.kind, 3.0)
    why = "achieved" if entry.achieved_gbs else "rated"
    if halve:
        return Link(name or f"{entry.key} (via host memory)", bw / 2, lat,
                    f"catalogue {entry.key}: {why} {bw:g} GB/s, halved: no peer-to-peer, staged through host memory")
    return Link(name or entry.key, bw, lat, f"catalogue {entry.key}: {why} {bw:g} GB/s")


@functools.cache
def ring_links(edges: tuple[tuple[int, int, int], ...], gpus: int) -> int:
    """NVLink links per GPU the rings through GPUs 0..gpus-1 use together (0: no all-NVLink ring). NCCL runs
    several rings at once over disjoint links; found greedily: the ring with the widest narrowest hop, its links
    taken away, again until no ring is left. Two GPUs: the links between them."""
    links: dict[tuple[int, int], int] = {}
    for a, b, n in edges:
        if a < gpus and b < gpus:
            links[(a, b)] = links[(b, a)] = links.get((a, b), 0) + n
    if gpus == 2:
        return links.get((0, 1), 0)
    total = 0
    while True:
        best, best_ring = 0, None
        for perm in itertools.permutations(range(1, gpus)):
            ring = (0, *perm, 0)
            narrow = min(links.get((ring[i], ring[i + 1]), 0) for i in range(gpus))
            if narrow > best:
                best, best_ring = narrow, ring
        if not best:
            return total
        total += best
        for i in range(gpus):
            a, b = best_ring[i], best_ring[i + 1]
            links[(a, b)] -= best
            links[(b, a)] -= best


def intra_link(gpu: GPU, interconnect: str | None, gpus_per_host: int) -> tuple[Link, str]:
    """(the ring's link inside one host of ``gpus_per_host`` GPUs, how it was found)."""
    system = find_system(interconnect) if interconnect else None
    if system is not None and not system.generic:
        return _system_link(system, gpu, gpus_per_host)
    if system is not None:  # a generic layout (PCIe GPUs behind switches): its link, the GPU's peer-to-peer
        interconnect = system.intra_host
    if interconnect is None:
        interconnect = f"pcie{gpu.pcie_gen}" if gpu.pcie_gen else "pcie3"
    try:
        entry = catalogue.link(interconnect)
    except ConfigError:
        raise ConfigError(f"unknown interconnect {interconnect!r}; known links: {_known('link')}; systems: "
                          f"{_known('system')}") from None
    no_p2p = entry.kind == "pcie" and gpu.peer_to_peer is False
    link = ring_link(entry, halve=no_p2p)
    how = (f"{entry.key}: no peer-to-peer on {gpu.key}, so GPU-to-GPU traffic goes through host memory (half the "
           "bandwidth)" if no_p2p else f"{entry.key}")
    return link, how


def _system_link(system: System, gpu: GPU, g: int) -> tuple[Link, str]:
    if g > system.gpus:
        raise ConfigError(f"{system.key} has {system.gpus} GPUs per host, asked for {g}")
    entry = system.intra_link
    if system.topology != "hybrid-cube-mesh" or g == 1:
        return ring_link(entry, system.key), f"{system.key}: {entry.key} ({system.topology})"
    narrow = ring_links(tuple(system.nvlink_edges), g)
    per_link = (entry.achieved_gbs or entry.gbs) / (entry.links or 1)
    if narrow:
        bw = narrow * per_link
        lat = entry.latency_us if entry.latency_us is not None else DEFAULT_LATENCY_US["nvlink"]
        return (Link(system.key, bw, lat, f"{system.key} hybrid cube-mesh: NVLink rings over {g} GPUs use "
                                          f"{narrow} link(s) per GPU x {per_link:g} GB/s"),
                f"{system.key}: rings over NVLink, {narrow} link(s) per GPU")
    host = catalogue.link(system.host_link or "pcie3")
    link = ring_link(host, f"{system.key} (PCIe hop)")
    return link, f"{system.key}: no all-NVLink ring over {g} GPUs, one hop crosses {host.key}"


def uplink_sharing(gpu: GPU, interconnect: str | None, gpus_per_host: int) -> tuple[int, str]:
    """(how many of the first ``gpus_per_host`` GPUs share the busiest PCIe link to the host, why): a system's GPUs
    per PCIe switch, else the GPUs of one board (K80: 2), else each GPU its own x16 link."""
    system = find_system(interconnect) if interconnect else None
    if system is not None and system.gpus_per_switch:
        k = min(gpus_per_host, system.gpus_per_switch)
        return k, f"{system.key}: {system.gpus_per_switch} GPUs per PCIe switch share its uplink"
    if gpu.gpus_per_board > 1:
        k = min(gpus_per_host, gpu.gpus_per_board)
        return k, f"{gpu.key}: {gpu.gpus_per_board} GPUs per board share its PCIe connector"
    return 1, "each GPU on its own PCIe link to the host (no shared uplink known)"


def _socket(system: System, index: int) -> int:
    per_switch = system.gpus_per_switch or system.gpus
    switches_per_cpu = max(1, (system.pcie_switches or 1) // (system.cpus or 1))
    return (index // per_switch) // switches_per_cpu


def in_order_ring_link(gpu: GPU, interconnect: str | None, gpus_per_host: int) -> tuple[Link, str]:
    """(the link of one ring through GPUs 0, 1, ..., G-1, 0 in device order, how it was found): NCCL 1.x's single
    ring. On a hybrid cube-mesh a hop without an NVLink crosses PCIe, through host memory between the CPUs; on any
    other layout the in-order ring has the link every ring has (intra_link)."""
    system = find_system(interconnect) if interconnect else None
    g = gpus_per_host
    if system is None or system.topology != "hybrid-cube-mesh" or g == 1:
        return intra_link(gpu, interconnect, g)
    if g > system.gpus:
        raise ConfigError(f"{system.key} has {system.gpus} GPUs per host, asked for {g}")
    entry = system.intra_link
    per_link = (entry.achieved_gbs or entry.gbs) / (entry.links or 1)
    nvlink = Link(f"{system.key} (one NVLink)", per_link,
                  entry.latency_us if entry.latency_us is not None else DEFAULT_LATENCY_US["nvlink"], entry.key)
    host = catalogue.link(system.host_link or "pcie3")
    hops = [(i, (i + 1) % g) for i in range(g)] if g > 2 else [(0, 1)]
    slowest, why = nvlink, f"{system.key}: one ring in device order, every hop one NVLink ({per_link:g} GB/s)"
    for a, b in hops:
        if system.neighbours(a).get(b):
            continue
        cross = _socket(system, a) != _socket(system, b)
        hop = ring_link(host, f"{system.key} (hop {a}-{b} over {host.key})", halve=cross)
        if hop.bandwidth_GBps < slowest.bandwidth_GBps:
            slowest = hop
            why = (f"{system.key}: one ring in device order; hop {a}->{b} has no NVLink and crosses {host.key}"
                   + (" between the CPUs, through host memory (half the link)" if cross else ""))
    return slowest, why


def inter_link(interconnect: str | None, inter_host: str | None) -> tuple[Link | None, int | None]:
    """(the NIC link between hosts, NICs per host from the system) or (None, None)."""
    system = find_system(interconnect) if interconnect else None
    name = inter_host or (system.nic if system is not None and system.nic else None)
    if not name:
        return None, None
    if "=" in name:  # a link of your own, NAME=GBps[:latency_us], as --interconnect takes it with a run directory
        return parse_link(name), (system.nics if system is not None else None)
    try:
        entry = catalogue.link(name)
    except ConfigError:
        raise ConfigError(f"unknown inter-host link {name!r}; known: {_known('link')}") from None
    return ring_link(entry), (system.nics if system is not None else None)
