"""A cost model of the expert-parallel MoE layer's step (forward + backward), from two measured
things: the link (an all-to-all sweep: seconds per tensor size) and the experts' compute (the
one-GPU layer at two token counts, which gives a per-expert cost ``a + b * rows``). It predicts the
step at EP = P for the exchanges ``fuseops.moe`` has: the exact one in one piece (four exchanges,
each after or before all the compute), and in pieces (the own rows at once, the remote rows in K
pieces whose exchanges run beside the experts: a two-resource schedule, link and compute, played
out piece by piece), and says how much of the exchange stays exposed.

Inside a node the link is NVLink through NVSwitch, whose all-to-all gives each GPU the same
outgoing bandwidth whatever the number of peers, so the sweep at one world size carries over;
beyond ``gpus_per_node`` the rows for other nodes leave through the network at a stated bandwidth
per GPU, concurrently with the NVLink traffic. What it leaves out: the host (the exact exchange's
one count read, launch time), and compute slowed by the exchange's copies sharing the SMs and HBM.

    python -m benchmarks.ep_cost_model                      # the H200 figures of docs, EP 2 to 64
    python -m benchmarks.ep_cost_model --network-gbps 400 --tokens 8192
"""

from __future__ import annotations

import argparse
import bisect
import math
from dataclasses import dataclass

# The all-to-all sweep on two H200s of one host (NVLink), NCCL ``all_to_all_single``, bf16, bytes
# of the tensor each rank holds -> seconds; ``python -m benchmarks.expert_parallel --world-size 2``
# measures it again (its results file's ``link_sweep``).
H200_SWEEP = ((16 * 2**20, 0.108e-3), (64 * 2**20, 0.189e-3), (256 * 2**20, 0.544e-3), (2**30, 1.758e-3))
H200_SWEEP_WORLD = 2
# The one-GPU layer, Qwen3-30B-A3B experts, bf16, forward + backward, ms, on one H200
# (``python -m benchmarks.expert_parallel``'s one-GPU row): tokens -> ms.
H200_ONE_GPU_MS = {8192: 3.95, 2048: 2.43}
# Forward share of the step: a third of the FLOPs (two GEMMs forward, four backward).
FORWARD_SHARE = 1 / 3
# HBM, read + write (device-to-device copy, H200).
HBM_BYTES_PER_S = 3.02e12
GPUS_PER_NODE = 8
# One 400 Gb/s NIC per GPU, the usual H100 / H200 node.
NETWORK_GBPS = 400.0


@dataclass(frozen=True)
class Shape:
    """The layer on each rank: ``tokens`` per GPU, ``experts`` in all, bf16 by default."""

    tokens: int
    top_k: int = 8
    hidden: int = 2048
    ffn: int = 768
    experts: int = 128
    element_bytes: int = 2

    def rows(self) -> int:
        return self.tokens * self.top_k

    def weight_bytes(self, experts: int) -> int:
        """Both GEMMs' weights (SwiGLU: 2 * ffn rows in, ffn columns out) of ``experts`` experts."""
        return experts * 3 * self.hidden * self.ffn * self.element_bytes


@dataclass(frozen=True)
class Link:
    """An all-to-all sweep at ``world`` ranks: ``points`` (bytes of each rank's tensor, seconds).
    ``seconds(remote)`` is the time to send ``remote`` bytes to other ranks, interpolated in
    log-log between the points; below the smallest, that point's time (latency); above the
    largest, at the largest's bandwidth."""

    points: tuple[tuple[int, float], ...]
    world: int

    def __post_init__(self) -> None:
        if len(self.points) < 1 or any(b <= 0 or t <= 0 for b, t in self.points) or self.world < 2:
            raise ValueError(f"points: expected (bytes > 0, seconds > 0) pairs and world >= 2, got {self.points} "
                             f"at world {self.world}")

    def remote(self, tensor_bytes: float) -> float:
        return tensor_bytes * (self.world - 1) / self.world

    def seconds(self, remote_bytes: float) -> float:
        pts = sorted((self.remote(b), t) for b, t in self.points)
        xs = [b for b, _ in pts]
        if remote_bytes <= xs[0]:
            return pts[0][1]
        if remote_bytes >= xs[-1]:
            return pts[-1][1] * remote_bytes / xs[-1]
        i = bisect.bisect_right(xs, remote_bytes)
        (x0, t0), (x1, t1) = pts[i - 1], pts[i]
        w = math.log(remote_bytes / x0) / math.log(x1 / x0)
        return math.exp(math.log(t0) + w * math.log(t1 / t0))

    def bandwidth(self, remote_bytes: float) -> float:
        """Remote bytes per second out of one GPU at that size."""
        return remote_bytes / self.seconds(remote_bytes)


@dataclass(frozen=True)
class Compute:
    """Per-expert cost of the expert MLP, forward and backward: ``a + b * rows`` seconds each."""

    forward: tuple[float, float]
    backward: tuple[float, float]

    @classmethod
    def from_one_gpu(cls, shape: Shape, step_s: dict[int, float], forward_share: float = FORWARD_SHARE,
                     forward_s: dict[int, float] | None = None) -> Compute:
        """From the one-GPU layer's step at two token counts (the forward alone where measured,
        else ``forward_share`` of the step): rows per expert ``tokens * top_k / experts``. At one
        token count the cost is all per row (``a = 0``)."""
        if not step_s:
            raise ValueError("step_s: expected the one-GPU step at one or two token counts, got none")
        points = sorted(step_s.items())[:2]
        fwd = [forward_s[t] if forward_s else s * forward_share for t, s in points]
        rows = [t * shape.top_k / shape.experts for t, _ in points]

        def fit(y: list[float]) -> tuple[float, float]:
            if len(y) == 1:
                return 0.0, y[0] / shape.experts / rows[0]
            b = (y[1] - y[0]) / shape.experts / (rows[1] - rows[0])
            return max(y[0] / shape.experts - b * rows[0], 0.0), b

        return cls(fit(fwd), fit([s - f for (_, s), f in zip(points, fwd)]))

    def seconds(self, experts: float, rows: float, forward: bool) -> float:
        a, b = self.forward if forward else self.backward
        return experts * a + b * rows


@dataclass(frozen=True)
class Prediction:
    step_s: float
    compute_s: float
    # One exchange (all rows of a rank, one way) and the four of a step, at the link's speed.
    exchange_s: float
    # What the schedule leaves uncovered of the exchanges, and extra work (gathers, the weight
    # gradient summed over pieces).
    exposed_s: float
    extra_s: float


def exchange_seconds(shape: Shape, world: int, link: Link, rows: int | None = None,
                     gpus_per_node: int = GPUS_PER_NODE, network_gbps: float = NETWORK_GBPS) -> float:
    """One exchange of ``rows`` (all of a rank's rows by default): the remote ones over NVLink
    inside the node and over the network beyond it, both at once."""
    rows = shape.rows() if rows is None else rows
    total = rows * shape.hidden * shape.element_bytes
    if world <= 1:
        return 0.0
    in_node = min(world, gpus_per_node)
    nvlink = link.seconds(total * (in_node - 1) / world)
    network = total * (world - in_node) / world / (network_gbps * 1e9 / 8)
    return max(nvlink, network)


def _schedule(link_s: list[float], compute_s: list[float], ready: list[bool]) -> float:
    """Pieces in compute order: piece i's inbound exchange ``link_s[i]`` (all inbound ones
    issued at once, in this order, one at a time on the link; 0 and ``ready`` for the own rows)
    then its compute, then its return on the link once the link is free. The time to the end of
    the last compute or return."""
    link_free, arrive = 0.0, []
    for d, r in zip(link_s, ready):
        link_free += 0.0 if r else d
        arrive.append(0.0 if r else link_free)
    t = 0.0
    for i, c in enumerate(compute_s):
        t = max(t, arrive[i]) + c
        if not ready[i]:
            link_free = max(link_free, t) + link_s[i]
    return max(t, link_free)


def predict(shape: Shape, world: int, compute: Compute, link: Link, *, pieces: int | None = None,
            own_first: bool = True, rows: int | None = None, hbm_bytes_per_s: float = HBM_BYTES_PER_S,
            gpus_per_node: int = GPUS_PER_NODE, network_gbps: float = NETWORK_GBPS) -> Prediction:
    """The step at EP = ``world``, ``shape.tokens`` per GPU, uniform routing. ``pieces=None``:
    one piece (exchange, experts, exchange; ``dispatch``). ``pieces=K``: the remote rows in K
    pieces beside the experts, the own rows first when ``own_first`` (``dispatch_chunks``
    exact), else every piece exchanged (the capacity chunks). ``rows``: rows exchanged per rank
    (capacity: P * C), default the routed ones."""
    local = shape.experts / world
    rows_here = shape.rows() if rows is None else rows
    fwd = compute.seconds(local, shape.rows(), True)
    bwd = compute.seconds(local, shape.rows(), False)
    one = exchange_seconds(shape, world, link, rows_here, gpus_per_node, network_gbps)
    row_bytes = rows_here * shape.hidden * shape.element_bytes
    if world == 1:
        return Prediction(fwd + bwd, fwd + bwd, 0.0, 0.0, 0.0)
    if pieces is None:
        # Four gathers between source-major and expert-major order (none with one local expert).
        gathers = 0.0 if local <= 1 else 4 * 2 * row_bytes / hbm_bytes_per_s
        return Prediction(fwd + bwd + 4 * one + gathers, fwd + bwd, one, 4 * one, gathers)
    own_share = 1 / world if own_first else 0.0
    remote_share = 1 - own_share
    # The link moves only remote rows: the remote pieces together take one exchange's time.
    link_s = ([0.0] if own_first else []) + [one / pieces] * pieces
    ready = ([True] if own_first else []) + [False] * pieces
    split = ([own_share] if own_first else []) + [remote_share / pieces] * pieces
    # The weight gradient of each piece after the first is added to the sum (read both, write).
    accumulate = (len(split) - 1) * 3 * shape.weight_bytes(round(local)) / hbm_bytes_per_s
    # Gathers where a piece holds rows from several sources (more than one remote rank).
    gathers = 0.0 if world <= 2 or local <= 1 else 4 * 2 * row_bytes * remote_share / hbm_bytes_per_s
    forward = _schedule(link_s, [fwd * s for s in split], ready)
    # The backward runs the pieces in reverse (autograd's order), the own rows last.
    backward = _schedule(link_s[::-1], [bwd * s for s in split[::-1]], ready[::-1])
    step = forward + backward + accumulate + gathers
    return Prediction(step, fwd + bwd, one, forward + backward - fwd - bwd, accumulate + gathers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per GPU")
    parser.add_argument("--network-gbps", type=float, default=NETWORK_GBPS, help="per GPU, between nodes")
    parser.add_argument("--gpus-per-node", type=int, default=GPUS_PER_NODE)
    parser.add_argument("--pieces", type=int, default=2, help="the overlapped exchange's remote pieces")
    args = parser.parse_args()
    shape = Shape(args.tokens)
    link = Link(H200_SWEEP, H200_SWEEP_WORLD)
    compute = Compute.from_one_gpu(shape, {t: ms / 1e3 for t, ms in H200_ONE_GPU_MS.items()})
    one_gpu = compute.seconds(shape.experts, shape.rows(), True) + compute.seconds(shape.experts, shape.rows(), False)
    print(f"Qwen3-30B-A3B experts (E={shape.experts}, H={shape.hidden}, I={shape.ffn}, top-{shape.top_k}), bf16, "
          f"{shape.tokens} tokens/GPU; one GPU (all experts) {one_gpu * 1e3:.2f} ms")
    print(f"link: the H200 NVLink sweep inside a node of {args.gpus_per_node}, {args.network_gbps:.0f} Gb/s per "
          "GPU beyond it; ms per step (forward + backward)")
    head = f"{'EP':>4}{'compute':>9}{'1 exch.':>9}{'exact':>8}{'x 1-GPU':>9}{f'overlap={args.pieces}':>11}" \
           f"{'x 1-GPU':>9}{'exposed':>9}{'extra':>7}  overlap hides"
    print(head)
    print("-" * len(head))
    for world in (2, 4, 8, 16, 64):
        kw = {"gpus_per_node": args.gpus_per_node, "network_gbps": args.network_gbps}
        exact = predict(shape, world, compute, link, **kw)
        over = predict(shape, world, compute, link, pieces=args.pieces, **kw)
        hidden = 1 - over.exposed_s / exact.exposed_s
        print(f"{world:>4}{over.compute_s * 1e3:>9.2f}{exact.exchange_s * 1e3:>9.2f}{exact.step_s * 1e3:>8.2f}"
              f"{exact.step_s / one_gpu:>9.2f}{over.step_s * 1e3:>11.2f}{over.step_s / one_gpu:>9.2f}"
              f"{over.exposed_s * 1e3:>9.2f}{over.extra_s * 1e3:>7.2f}  {hidden:.0%} of the exchange")
    print("overlap stops hiding the exchange where one exchange outlasts a piece's compute: the link then sets "
          "the step (exposed grows with EP), and each extra piece costs a weight-gradient sum (extra).")


if __name__ == "__main__":
    main()
