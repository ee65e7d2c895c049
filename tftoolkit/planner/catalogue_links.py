"""The links a forecast without a run directory uses, resolved from the catalogue (tftoolkit/catalogue/*.toml).

Each term of the communication model, with its source, in one place:

- **Ring bandwidth inside a host** = the link's ``achieved_gbs`` (what an all-reduce reaches in practice, per the
  catalogue's source for that link), else its rated ``gbs``.
- **No peer-to-peer** (``peer_to_peer = false`` in gpus.toml: GeForce cards), **or a ring that crosses the CPU
  sockets** of a PCIe server (NCCL does not use peer-to-peer across the CPUs' interconnect unless NCCL_P2P_LEVEL=SYS,
  its environment documentation says): GPU-to-GPU traffic is staged through host memory (NCCL's SHM transport), so
  every byte crosses the GPU's PCIe link twice (GPU -> host, host -> GPU): at most half the link per GPU. And the
  host is a **shared link**: the GPUs staging through one CPU socket's memory and root complexes share that
  socket's capacity C, so each gets min(link / 2, C / G_socket), falling with the GPUs sharing it (host_staged_link).
  A ring spanning the sockets also crosses their link: at most its bandwidth (``socket_link_gbs``, default
  SOCKET_LINK_GBS, NCCL's own figure for Skylake UPI).
  C is the system's ``host_staging_gbs`` (systems.toml, per socket); a generic server's default is
  HOST_STAGING_X16 x the x16 link rate of the GPU's PCIe generation per socket, 2 sockets of 4 GPUs each. Source of
  that ratio: NVIDIA/nccl#1130 (all_reduce_perf with P2P disabled: 24 GB/s bus bandwidth on 4 GPUs of one NUMA node,
  35 GB/s on 4 spread over two; the sockets' memory, not each GPU's link, bound the first: 4 x 24 = 96 GB/s per
  socket = 1.5 x PCIe 5 x16's 63 GB/s; the report does not name its GPUs' PCIe generation: taken as PCIe 5,
  unconfirmed). The catalogue's gpus.toml names the source for which cards lack peer-to-peer.
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

HOST_STAGING_X16 = 1.5     # a socket's staged capacity in x16 links of the GPU's PCIe generation (NVIDIA/nccl#1130)
SOCKET_LINK_GBS = 10.0     # between two sockets, per direction, unless a system says: NCCL's own figure for Intel
# Skylake's UPI (SKL_QPI_BW 10.0 in NVIDIA/nccl src/graph/topo.h, which has 6 for Broadwell's QPI, 16-32 for AMD's
# Infinity Fabric, 22-40 for Sapphire/Emerald Rapids): the two-socket server of the PCIe 3/4 years
GENERIC_SOCKETS = 2        # a generic server without a named system: two CPU sockets ...
GENERIC_GPUS_PER_SOCKET = 4  # ... of 4 GPUs each, filled in device order (pcie-8x-2switch's layout)
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


def gpu_pcie(gpu: GPU) -> str:
    """The links.toml key of the GPU's own PCIe link (its generation; PCIe 3 where the catalogue has none)."""
    return f"pcie{gpu.pcie_gen}" if gpu.pcie_gen else "pcie3"


def host_staging(system: System | None, gpu: GPU) -> tuple[float, int, int, str]:
    """(capacity per CPU socket in GB/s, sockets, GPUs per socket, where they come from) for traffic staged through
    host memory: the system's ``host_staging_gbs``, else the generic default (HOST_STAGING_X16 x the x16 rate of the
    GPU's PCIe generation; a system's sockets and GPUs, else GENERIC_SOCKETS of GENERIC_GPUS_PER_SOCKET)."""
    x16 = catalogue.link(gpu_pcie(gpu)).gbs or 15.75
    sockets = (system.cpus if system is not None and system.cpus else GENERIC_SOCKETS)
    per_socket = (max(1, system.gpus // sockets) if system is not None and system.gpus else GENERIC_GPUS_PER_SOCKET)
    if system is not None and system.host_staging_gbs:
        return system.host_staging_gbs, sockets, per_socket, f"{system.key}'s host_staging_gbs"
    where = system.key if system is not None else "a generic server"
    return (HOST_STAGING_X16 * x16, sockets, per_socket,
            f"{where}: default {HOST_STAGING_X16:g} x {gpu_pcie(gpu)} x16 ({x16:g} GB/s) per socket, "
            f"{sockets} sockets of {per_socket} GPUs (NVIDIA/nccl#1130)")


def socket_crossing(gpu: GPU, interconnect: str | None, g: int) -> tuple[Link | None, int]:
    """(the link between the CPU sockets, GPUs beyond the first socket) where ``g`` GPUs staged through host memory
    span the sockets, else (None, 0): what a parameter server's holder on the first socket receives across it."""
    system = find_system(interconnect) if interconnect else None
    if system is not None and not system.generic:
        return None, 0
    _, sockets, per_socket, _ = host_staging(system, gpu)
    if sockets < 2 or g <= per_socket:
        return None, 0
    bw = system.socket_link_gbs if system is not None and system.socket_link_gbs else SOCKET_LINK_GBS
    return Link("the sockets' link", bw, DEFAULT_LATENCY_US["pcie"], "socket_link_gbs"), g - per_socket


def host_staged_link(entry, gpu: GPU, system: System | None, g: int, why: str,
                     ring: bool = True) -> tuple[Link, str]:
    """The ring's link when its traffic is staged through host memory: half the PCIe link per GPU, and the GPUs on
    one socket share its capacity C: min(link / 2, C / GPUs on the busiest socket) (the module's docstring)."""
    half = ring_link(entry, halve=True)
    cap, sockets, per_socket, where = host_staging(system, gpu)
    busiest = min(g, per_socket)  # device order fills the first socket first
    shared = cap / busiest
    socket_link = (system.socket_link_gbs if system is not None and system.socket_link_gbs else SOCKET_LINK_GBS)
    if ring and g > per_socket and sockets > 1 and socket_link < min(shared, half.bandwidth_GBps):
        # The ring crosses between the sockets once each way: every byte it moves crosses their link.
        link = Link(f"{entry.key} (via host memory, across the sockets)", socket_link, half.latency_us,
                    f"the sockets' link {socket_link:g} GB/s")
        return link, (f"{entry.key}: {why}, so GPU-to-GPU traffic goes through host memory, and the ring over {g} "
                      f"GPUs crosses between the CPU sockets at {socket_link:g} GB/s per direction ("
                      + (f"{system.key}'s socket_link_gbs" if system is not None and system.socket_link_gbs else
                         "default: NCCL's figure for Skylake UPI") + f"; {where})")
    if shared >= half.bandwidth_GBps:
        return half, (f"{entry.key}: {why}, so GPU-to-GPU traffic goes through host memory (half the bandwidth; "
                      f"the host's {cap:g} GB/s per socket shared by {busiest} GPU(s) is not the limit: {where})")
    link = Link(f"{entry.key} (via host memory, {busiest} GPUs per socket)", shared, half.latency_us,
                f"{where}: {cap:g} GB/s per socket shared by {busiest} GPUs")
    return link, (f"{entry.key}: {why}, so GPU-to-GPU traffic goes through host memory, whose {cap:g} GB/s per "
                  f"socket {busiest} GPUs share: {shared:.3g} GB/s each, less than half the link ({where})")


def intra_link(gpu: GPU, interconnect: str | None, gpus_per_host: int, ring: bool = True) -> tuple[Link, str]:
    """(the ring's link inside one host of ``gpus_per_host`` GPUs, how it was found); ``ring`` False: one GPU's own
    link to the others, without the ring's crossing between the sockets (a parameter server's holder)."""
    system = find_system(interconnect) if interconnect else None
    if system is not None and not system.generic:
        return _system_link(system, gpu, gpus_per_host)
    if system is not None:  # a generic layout (PCIe GPUs behind switches): the GPU's own PCIe generation
        interconnect = gpu_pcie(gpu) if gpu.pcie_gen else system.intra_host
    if interconnect is None:
        interconnect = gpu_pcie(gpu)
    try:
        entry = catalogue.link(interconnect)
    except ConfigError:
        raise ConfigError(f"unknown interconnect {interconnect!r}; known links: {_known('link')}; systems: "
                          f"{_known('system')}") from None
    if entry.kind == "pcie" and gpu.peer_to_peer is False:
        return host_staged_link(entry, gpu, system, gpus_per_host, f"no peer-to-peer on {gpu.key}", ring)
    if system is not None and entry.kind == "pcie" and gpus_per_host > host_staging(system, gpu)[2]:
        return host_staged_link(entry, gpu, system, gpus_per_host,
                                f"{gpus_per_host} GPUs span the CPU sockets of {system.key} (no peer-to-peer there)",
                                ring)
    return ring_link(entry), f"{entry.key}"


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


def link_class(gpu: GPU, interconnect: str | None, gpus_per_host: int) -> str:
    """The hardware class of a host's GPU-to-GPU path, as the interval knows it (intervals.py): "nvlink" (NVLink,
    NVSwitch, a bridge), "pcie peer-to-peer", or "pcie via host memory" (no peer-to-peer, or across the sockets of a
    named PCIe server)."""
    system = find_system(interconnect) if interconnect else None
    if system is not None and not system.generic:
        return "nvlink" if system.intra_link.kind in ("nvlink", "nvswitch") else "pcie peer-to-peer"
    key = (gpu_pcie(gpu) if gpu.pcie_gen else system.intra_host) if system is not None else (interconnect or gpu_pcie(gpu))
    try:
        kind = catalogue.link(key).kind
    except ConfigError:
        return "unknown"
    if kind != "pcie":
        return "nvlink" if kind in ("nvlink", "nvswitch") else kind
    if gpu.peer_to_peer is False or (system is not None and gpus_per_host > host_staging(system, gpu)[2]):
        return "pcie via host memory"
    return "pcie peer-to-peer"

