"""Hardware, measured: memory bandwidth, caches, FLOP/s per dtype, dispatch overhead, and a roofline.

The seed's hardware section recites numbers; this recipe measures this machine's, so that every other
recipe's results can be read against them.

Run:   python recipes/hardware.py --quick        (about a minute on 2 CPU cores)
Needs: TensorFlow 2.21 and NumPy. On a GPU host the host's roofs are measured on /CPU:0, and the first
GPU's in tables of their own: its memory bandwidth, host<->device copies, matmul FLOP/s per dtype.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses
import socket
import sys
import tempfile
import threading
import zlib
from pathlib import Path

import numpy as np
import tensorflow as tf

from tfperf import flags
from tfperf.gpus import Gpu, in_exact_float32, rate_block_size, tensorflow_gpus, tf32_in_effect
from tfperf.measure import Timer, interleave, versus
from tfperf.measure.timer import matmul_flops_per_s
from tfperf.catalog import MODEL_NAMES
from tfperf.models import activation_bytes, flops, get_net
from tfperf.recipe import Conclusion, Headline, Recipe
from tfperf.records.report import save_figure
from tfperf.measure.stats import NO_DIFFERENCE, Comparison

# What is measured: two roofs, and where the models sit under them --------------------------------------
# Two roofs bound any kernel: the arithmetic rate (FLOP/s) and the memory bandwidth (bytes/s). Their
# ratio is the ridge point: a computation with fewer FLOPs per byte moved than that is memory-bound.
# The recipe measures streaming bandwidth, a working-set sweep whose steps are the cache levels, matmul
# FLOP/s per dtype and size (the per-call clock checked against matmuls chained inside one call, and
# compared with NumPy's own BLAS in the same interleaved rounds), the cost of dispatching
# one op, and places the cookbook's models on the roofline. A last table puts this machine's rows next
# to the classic "latency numbers every programmer should know". On a GPU host, the GPU's own roofs
# follow: its memory, the copies between host and GPU memory that every input batch makes, and its
# matmul rate per dtype, naming the units (CUDA cores, tensor cores) each dtype runs on there.

MEMORY, CACHE, FLOPS, DISPATCH, ROOFLINE, LATENCY = (
    "memory bandwidth", "working-set sweep: latency of a dependent load", "matmul FLOP/s by dtype and size",
    "dispatch overhead per call", "roofline: the cookbook's models (forward, batch 64)", "latency numbers")
GPU_MEMORY, GPU_COPIES, GPU_FLOPS = ("GPU memory bandwidth", "copies between host and GPU memory",
                                     "GPU matmul FLOP/s by dtype and size")
HOST_SIZES = {False: (256, 512, 1024, 2048), True: (256, 1024, 2048)}  # matmul sizes on the CPU, by --quick
GPU_SIZES = (1024, 4096, 8192)  # tensor cores need large matmuls to fill a GPU's many multiprocessors
AGREEMENT = 0.30  # the per-call clock fails its check when its CI against a chained run lies beyond this
CHAIN = 10  # matmuls chained inside one graph call for the clock check
# Latency numbers every programmer should know (Dean and Norvig), as the seed quotes them, in seconds.
CLASSIC = {"L1 cache reference": 0.5e-9, "L2 cache reference": 7e-9, "main memory reference": 100e-9,
           "compress 1 KB with zlib": 3e-6, "read 1 MB sequentially from memory": 250e-6,
           "round trip within a data center": 500e-6, "read 1 MB sequentially from disk": 20e-3}


@dataclasses.dataclass(frozen=True)
class Found:
    clock_check: Comparison  # the per-call clock against matmuls chained in one call and read back
    size: int  # the matmul size the clock was checked at
    tf_gflops: float
    numpy_gflops: float
    numpy_vs_tf: Comparison
    figure: str  # the roofline chart
    ridge: float  # FLOPs per byte where the two roofs meet
    bandwidth: float  # bytes/s
    peak: float  # FLOP/s
    at_level: dict  # the working-set sweep's latency per cache level
    dispatch: dict  # seconds to dispatch one op, per kind of call
    gpu: dict | None = None  # the first GPU's roofs (see measure_gpu), None without a GPU


def best_of(fn, reps: int) -> float:
    """Fastest of `reps` timed runs after a first one, in seconds: the least disturbed by the other
    tenants of a shared machine (a roof, not a typical time)."""
    return Timer(fn).measure(reps, warmup=0).min_s


def cache_sizes() -> dict[str, int]:
    """Data cache sizes from sysfs (Linux), e.g. {"L1": 32768, "L2": 524288, "L3": 33554432}."""
    sizes = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip()
            sizes[f"L{(index / 'level').read_text().strip()}"] = int(text[:-1]) * 1024 if text.endswith("K") else int(text)
        except (OSError, ValueError):
            continue
    return sizes


def tcp_round_trip_s(reps: int = 200) -> float:
    """Median time for one byte to go to a local echo thread and back over TCP."""
    server = socket.create_server(("localhost", 0))
    port = server.getsockname()[1]

    def echo():
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    with socket.create_connection(("localhost", port)) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        trip = Timer(lambda: client.sendall(b"x") or client.recv(1), name="tcp round trip")
        median = trip.measure(reps, warmup=10).median_s
    server.close()
    return median


def add_flags(p) -> None:
    p.add_argument("--stream-mb", type=flags.positive_int, help="array size of the streaming benchmarks (MB)")


def tensor_cores(dtype: str, capability: tuple[int, int] | None, tf32: bool) -> str:
    """The units a matmul in `dtype` runs on, on a GPU of this compute capability: float16 tensor cores
    from 7.0 (Volta), bfloat16 and TF32 ones from 8.0 (Ampere), CUDA cores otherwise."""
    cap = capability or (0, 0)
    if dtype == "float16" and cap >= (7, 0) or dtype == "bfloat16" and cap >= (8, 0):
        return "tensor cores"
    if dtype == "float32" and tf32 and cap >= (8, 0):
        return "tensor cores (TF32)"
    return "CUDA cores"


def measure(args, rec) -> Found:
    # The host's roofs: on a GPU host TensorFlow would place these ops on the GPU and mix its FLOP/s with the
    # host's bandwidth, so everything here runs on the CPU.
    with tf.device("/CPU:0"):
        found = measure_host(args, rec)
    gpus = tensorflow_gpus()
    return dataclasses.replace(found, gpu=measure_gpu(args, rec, "/GPU:0", gpus[0])) if gpus else found


def measure_gpu(args, rec, device: str, gpu: Gpu) -> dict:
    """The GPU's roofs: memory bandwidth, copies to and from the host, matmul FLOP/s per dtype. Each is timed
    in blocks of calls with one sync (rate_block_size): one sync per call would time the sync."""
    n = args.stream_mb * 2**20 // 4
    block = rate_block_size("GPU" in device.upper())
    with tf.device("/CPU:0"):
        host = tf.ones([n])
    with tf.device(device):
        x = tf.ones([n])
        total, copy = tf.function(tf.reduce_sum), tf.function(lambda x: tf.raw_ops.DeepCopy(x=x))

    def timed(fn, name: str) -> float:
        with tf.device(device):
            return Timer(fn, name=name, block_size=block).measure(args.steps, warmup=args.warmup).min_s

    found = {"name": gpu.name, "device": device,
             "read_gb_per_s": 4 * n / timed(lambda: total(x), "GPU reduce_sum") / 1e9,
             "copy_gb_per_s": 2 * 4 * n / timed(lambda: copy(x), "GPU DeepCopy") / 1e9}
    rec.add(GPU_MEMORY, f"reduce_sum on {device} (read)", {"gb_per_s": found["read_gb_per_s"], "mb": args.stream_mb},
            primary="gb_per_s", lower_is_better=False)
    rec.add(GPU_MEMORY, f"copy on {device} (read + write)", {"gb_per_s": found["copy_gb_per_s"], "mb": args.stream_mb},
            primary="gb_per_s", lower_is_better=False)

    # Host <-> GPU: an op placed on the other side copies its input there (tf.identity itself copies nothing).
    def to_device():
        with tf.device(device):
            return tf.identity(host)

    def to_host():
        with tf.device("/CPU:0"):
            return tf.identity(x)

    found["to_device_gb_per_s"] = 4 * n / timed(to_device, "host to GPU") / 1e9
    found["to_host_gb_per_s"] = 4 * n / timed(to_host, "GPU to host") / 1e9
    for row, key in (("host to GPU", "to_device_gb_per_s"), ("GPU to host", "to_host_gb_per_s")):
        rec.add(GPU_COPIES, row, {"gb_per_s": found[key], "mb": args.stream_mb,
                                  "vs_device_copy": found[key] / found["copy_gb_per_s"]},
                primary="gb_per_s", lower_is_better=False)

    # Matmul FLOP/s per dtype; float32 with TF32 on (TensorFlow's default from 8.0) and off.
    tf32 = tf32_in_effect(tf.config.experimental.tensor_float_32_execution_enabled(), [gpu])
    rows = [("float32", "float32", False), *([("float32, TF32 off", "float32", True)] if tf32 else []),
            ("float16", "float16", False), ("bfloat16", "bfloat16", False)]
    found["gflops"], found["not_run"] = {}, {}
    for row, dtype, exact in rows:
        rate = in_exact_float32(matmul_flops_per_s) if exact else matmul_flops_per_s
        units = tensor_cores(dtype, gpu.compute_capability, tf32 and not exact)
        for size in GPU_SIZES[:2] if args.quick else GPU_SIZES:
            try:
                with tf.device(device):
                    gflops = rate(size, dtype=dtype, steps=args.steps) / 1e9
            except tf.errors.OpError as exc:  # a dtype this GPU's libraries do not multiply: said, not fatal
                found["not_run"][row] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
                break
            found["gflops"][row] = max(found["gflops"].get(row, 0.0), gflops)
            rec.add(GPU_FLOPS, f"{row} {size}", {"gflops": gflops, "units": units}, primary="gflops",
                    lower_is_better=False, versus_first=False)
    return found


def measure_host(args, rec) -> Found:
    bandwidth, copy_gb_per_s = memory_bandwidth(args, rec)
    cache_latencies(args, rec)
    clock_check, size, tf_gflops, numpy_gflops, numpy_vs_tf, peak = matmul_rates(args, rec)
    dispatch = dispatch_costs(rec)
    figure, ridge = roofline(args, rec, peak, bandwidth)
    at_level = latency_table(rec, copy_gb_per_s)
    return Found(clock_check, size, tf_gflops, numpy_gflops, numpy_vs_tf, str(figure), ridge, bandwidth, peak,
                 at_level, dispatch)


def memory_bandwidth(args, rec) -> tuple[float, float]:
    """Stream a large array that no cache can hold: (the faster stream in bytes/s, NumPy's copy in GB/s)."""
    n = args.stream_mb * 2**20 // 4
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    numpy_copy = best_of(lambda: np.copyto(dst, src), args.steps)
    x = tf.ones([n])
    total = tf.function(tf.reduce_sum)  # reads every float once and writes one: a pure read stream
    tf_stream = Timer(lambda: total(x), name="stream").measure(args.steps, warmup=args.warmup,
                                                               profile_dir=args.profile).min_s
    rec.add(MEMORY, "NumPy copy (one core, read + write)", {"gb_per_s": 2 * 4 * n / numpy_copy / 1e9,
                                                            "mb": args.stream_mb}, primary="gb_per_s",
            lower_is_better=False)
    rec.add(MEMORY, "TensorFlow reduce_sum (all cores, read)", {"gb_per_s": 4 * n / tf_stream / 1e9,
                                                                "mb": args.stream_mb}, primary="gb_per_s",
            lower_is_better=False)
    return max(4 * n / tf_stream, 2 * 4 * n / numpy_copy), 2 * 4 * n / numpy_copy / 1e9


def cache_latencies(args, rec) -> None:
    """The time of one dependent load in tables of growing size, each named by the level it fits in."""
    caches = cache_sizes()
    # The working-set sweep: follow a random cycle through ever larger tables, one load after another.
    # Each load's address is the previous load's value, so nothing overlaps: the time per step is the latency
    # of the level the table fits in (plus about 3 ns of loop, compiled by XLA).
    chase = tf.function(jit_compile=True, reduce_retracing=True)(
        lambda table, steps: tf.while_loop(lambda k, i: k < steps, lambda k, i: (k + 1, tf.gather(table, i)),
                                           (tf.constant(0), tf.constant(0)))[1])
    rng = np.random.default_rng(args.seed)
    latency = {}
    for kib in [4 ** k * 16 for k in range(7 if args.quick else 8)]:
        order = rng.permutation(kib * 256).astype(np.int32)
        table = np.empty_like(order)
        table[order] = np.roll(order, -1)  # one cycle through every slot, in random order
        table, steps = tf.constant(table), 1_000_000
        chase(table, tf.constant(10))
        latency[kib] = best_of(lambda: chase(table, tf.constant(steps)).numpy(), 2) / steps
        level = next((k for k, v in sorted(caches.items()) if kib * 1024 <= v), "DRAM")
        rec.add(CACHE, f"{kib:,} KiB", {"ns_per_load": latency[kib] * 1e9, "fits_in": level},
                primary="ns_per_load", lower_is_better=True, versus_first=False)


def matmul_rates(args, rec):
    """Matmul FLOP/s per dtype and size, the clock checked against chained matmuls read back, NumPy's BLAS
    beside TensorFlow, and the float32 peak: (clock check, size, TF and NumPy GFLOP/s, NumPy vs TF, peak)."""
    for dtype in (tf.float32, tf.bfloat16, tf.float16, tf.float64):
        for size in HOST_SIZES[args.quick]:
            rec.add(FLOPS, f"{dtype.name} {size}", {"gflops": matmul_flops_per_s(size, dtype=dtype, steps=args.steps) / 1e9},
                    primary="gflops", lower_is_better=False, versus_first=False)
    # The check on the clock: the per-call figure (synced, nothing copied) against the same matmuls chained
    # inside one graph call and read back to the host, which cannot finish early. NumPy's BLAS is timed in
    # the same interleaved rounds: a different library, so a difference is its speed, not an error.
    size = 1024
    a32 = (np.random.default_rng(args.seed).standard_normal((size, size)) / size ** 0.5).astype(np.float32)
    t32, matmul = tf.constant(a32), tf.function(tf.matmul)
    chained = tf.function(lambda: tf.foldl(lambda y, _: tf.matmul(y, t32), tf.range(CHAIN), initializer=t32))
    timers = [Timer(lambda: matmul(t32, t32), name=f"TensorFlow float32 {size}, per call"),
              Timer(chained, name=f"TensorFlow float32 {size}, {CHAIN} chained in one call, read back",
                    items_per_call=CHAIN, sync_fn=lambda y: y.numpy()),
              Timer(lambda: a32 @ a32, name=f"NumPy float32 {size}")]
    per_call, chain, numpy_m = interleave(timers, samples=max(10, args.steps), warmup=1, seed=args.seed)
    numpy_vs_tf = versus(per_call, numpy_m)
    for m, c in ((per_call, None), (chain, None), (numpy_m, numpy_vs_tf)):
        rec.add(FLOPS, m.name, {"gflops": 2 * size ** 3 / m.median_per_item_s / 1e9}, primary="gflops",
                lower_is_better=False, versus_first=False, measurement=m, comparison=c)
    tf_gflops, numpy_gflops = (2 * size ** 3 / m.median_per_item_s / 1e9 for m in (per_call, numpy_m))
    # Paired by rounds, judged by the CI: a clock that stops early shows up as a ratio whose whole interval lies
    # beyond the bar; a busy machine widens the interval instead of failing the check.
    clock_check = versus(chain, per_call, threshold=AGREEMENT)
    # The compute roof: the best float32 rate any implementation reached here (NumPy's BLAS counts too).
    peak = max(r["metrics"]["gflops"] for r in rec.table(FLOPS) if "float32" in r["row"]) * 1e9
    return clock_check, size, tf_gflops, numpy_gflops, numpy_vs_tf, peak


def dispatch_costs(rec) -> dict[str, float]:
    """The cost of one call, whatever it computes: seconds per call of Python, NumPy, an eager op, a graph."""
    one = tf.constant(1.0)
    graph_add = tf.function(lambda a: a + a)
    graph_add(one)
    calls = [("Python function call", lambda: (lambda a: a)(1.0)),
             ("NumPy scalar add", lambda: np.float32(1.0) + np.float32(1.0)),
             ("TensorFlow eager op (one add)", lambda: one + one),
             ("tf.function call (one add)", lambda: graph_add(one))]
    dispatch = {}
    for row, fn in calls:
        reps = 2000
        dispatch[row] = best_of(lambda: [fn() for _ in range(reps)], 3) / reps
        rec.add(DISPATCH, row, {"us_per_call": dispatch[row] * 1e6}, primary="us_per_call", lower_is_better=True)
    return dispatch


def roofline(args, rec, peak: float, bandwidth: float) -> tuple[Path, float]:
    """Where each model's forward pass sits under this machine's roofs: (the chart, the ridge point)."""
    ridge = peak / bandwidth
    points = []
    for name in MODEL_NAMES:
        model = get_net(name)
        batch = 64
        xb = tf.random.normal([batch, *model.input_shape[1:]])
        forward = tf.function(lambda x: model(x, training=False))
        r = Timer(lambda: forward(xb), name=name).measure(max(3, args.steps // 2), warmup=args.warmup,
                                                          profile_dir=args.profile)
        work = flops(model) * batch
        traffic = 4 * model.count_params() + activation_bytes(model, batch) + xb.numpy().nbytes
        intensity = work / traffic
        achieved = work / r.median_s
        roof = min(peak, intensity * bandwidth)
        points.append((name, intensity, achieved))
        rec.add(ROOFLINE, name, {"flops_per_byte": intensity, "achieved_gflops": achieved / 1e9,
                                 "roof_gflops": roof / 1e9, "share_of_roof": achieved / roof,
                                 "bound": "memory" if intensity < ridge else "compute"},
                primary="achieved_gflops", lower_is_better=False, versus_first=False)
    figure = roofline_plot(points, peak, bandwidth, Path(args.out) / "figures" / "hardware-roofline.png")
    return figure, ridge


def latency_table(rec, copy_gb_per_s: float) -> dict[str, float]:
    """The classic latency table with this machine's measurements next to it; returns the seconds of a
    dependent load in each level (the first table that fits it)."""
    at_level = {}
    for r in rec.table(CACHE):
        at_level.setdefault(r["metrics"]["fits_in"], r["metrics"]["ns_per_load"] / 1e9)  # the first fit
    dram_gbs = copy_gb_per_s / 2  # one direction of the copy
    kb = os.urandom(512) * 2
    with tempfile.NamedTemporaryFile() as f:
        f.write(os.urandom(1 << 20) * 16)
        f.flush()
        disk = best_of(lambda: Path(f.name).read_bytes(), 3) / 16
    measured = {"L1 cache reference": at_level.get("L1"), "L2 cache reference": at_level.get("L2"),
                "main memory reference": at_level.get("DRAM"),
                "compress 1 KB with zlib": best_of(lambda: [zlib.compress(kb) for _ in range(200)], 3) / 200,
                "read 1 MB sequentially from memory": 2**20 / (dram_gbs * 1e9),
                "round trip within a data center": tcp_round_trip_s(),
                "read 1 MB sequentially from disk": disk}
    notes = {"L1 cache reference": "dependent loads, 16 KiB table", "L2 cache reference": "dependent loads",
             "main memory reference": "dependent loads, largest table (TLB misses included)",
             "round trip within a data center": "localhost TCP round trip",
             "read 1 MB sequentially from disk": "page cache (the file was just written)"}
    for row, classic in CLASSIC.items():
        rec.add(LATENCY, row, {"classic_ns": classic * 1e9,
                               "measured_here_ns": measured[row] * 1e9 if measured.get(row) else None,
                               "how": notes.get(row, "measured") if measured.get(row) else "not measured"},
                primary="classic_ns", lower_is_better=True, versus_first=False)
    return at_level


def conclude(args, rec, found: Found) -> Conclusion:
    clock_check, numpy_vs_tf, ridge, bandwidth, peak, at_level, dispatch = (
        found.clock_check, found.numpy_vs_tf, found.ridge, found.bandwidth, found.peak, found.at_level,
        found.dispatch)
    agree = clock_check.verdict == NO_DIFFERENCE
    lines = [f"matmul float32 {found.size}: the per-call clock and {CHAIN} chained matmuls read back "
             f"{'agree' if agree else 'DISAGREE'} within {AGREEMENT:.0%} (per call against chained: "
             f"{clock_check.describe()}); TensorFlow "
             f"{found.tf_gflops:.1f} GFLOP/s, NumPy {found.numpy_gflops:.1f} GFLOP/s: NumPy "
             f"{numpy_vs_tf.describe()}",
             f"roofline: {found.figure}; ridge point {ridge:.1f} FLOP/byte"]

    r = {row["row"]: row["metrics"] for row in rec.table(ROOFLINE)}
    return Conclusion((
        f"This machine streams {bandwidth / 1e9:.1f} GB/s from memory (the faster of NumPy's copy and "
        f"TensorFlow's reduce_sum) and multiplies "
        f"float32 matrices at up to {peak / 1e9:.0f} GFLOP/s (the per-call clock "
        f"{'agreeing' if agree else 'NOT agreeing'} within {AGREEMENT:.0%} with a chained run read back; NumPy's "
        f"BLAS against TensorFlow: {numpy_vs_tf.describe()}), so its ridge point is "
        f"{ridge:.0f} FLOP per byte: below that a kernel is memory-bound. A dependent load takes "
        + ", ".join(f"{s * 1e9:.0f} ns in {level}" for level, s in at_level.items())
        + f": the cache hierarchy is why locality matters. One eager op costs "
        f"{dispatch['TensorFlow eager op (one add)'] * 1e6:.1f} us and a tf.function call "
        f"{dispatch['tf.function call (one add)'] * 1e6:.1f} us, against "
        f"{dispatch['NumPy scalar add'] * 1e6:.2f} us for NumPy: at batch 1 that overhead, not arithmetic, is "
        f"the cost (hybridize). On the roofline, at batch 64: "
        + ", ".join(f"{name} {m['flops_per_byte']:.0f} FLOP/B ({m['bound']}-bound, {m['share_of_roof']:.0%} of "
                    f"its roof)" for name, m in r.items())
        + ". A model far below its roof is limited by something else: dispatch, small kernels, or the "
        "memory traffic of element-wise layers that the FLOP count ignores." + gpu_text(found.gpu, bandwidth)),
        lines,
        "" if agree else "the per-call clock disagrees with chained matmuls read back",
        Headline("this machine's roofline: float32 matmul peak, memory bandwidth, ridge point",
                 f"{peak / 1e9:.0f} GFLOP/s, {bandwidth / 1e9:.1f} GB/s, ridge {ridge:.0f} FLOP/byte",
                 "per-call clock agrees with chained matmuls" if agree else "per-call clock DISAGREES",
                 (clock_check.baseline, clock_check.candidate), value=peak / 1e9, unit="GFLOP/s"))


def gpu_text(gpu: dict | None, host_bandwidth: float) -> str:
    """The conclusion's sentences on the GPU's roofs, empty without a GPU."""
    if gpu is None:
        return ""
    rates = gpu["gflops"]
    f32 = rates.get("float32, TF32 off", rates["float32"])
    return (f" On {gpu['device']} ({gpu['name']}), memory reads stream at {gpu['read_gb_per_s']:.0f} GB/s "
            f"({gpu['read_gb_per_s'] * 1e9 / host_bandwidth:.1f}x the host's) and copies at {gpu['copy_gb_per_s']:.0f} "
            f"GB/s, while copies from the host run at {gpu['to_device_gb_per_s']:.1f} GB/s and back at "
            f"{gpu['to_host_gb_per_s']:.1f} GB/s ({gpu['to_device_gb_per_s'] / gpu['copy_gb_per_s']:.2f}x the "
            f"device's own copy)"
            + (": input batches must reach the GPU ahead of the step that needs them (a tf.data pipeline ending "
               "in prefetch, or prefetch_to_device)" if gpu["to_device_gb_per_s"] < gpu["copy_gb_per_s"] else "")
            + ". Its matmuls reach "
            + ", ".join(f"{r} {v / 1e3:.1f} TFLOP/s ({v / f32:.1f}x float32)" for r, v in rates.items()) + "."
            + "".join(f" {r} matmuls did not run here ({why})." for r, why in gpu["not_run"].items()))


def roofline_plot(points, peak: float, bandwidth: float, path: Path) -> Path:
    """The roofline (log-log) with each model's measured point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = np.logspace(-1, 4, 200)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(xs, np.minimum(peak, xs * bandwidth) / 1e9, color="black", label="roof: min(peak, intensity x bandwidth)")
    for name, intensity, achieved in points:
        ax.scatter(intensity, achieved / 1e9, zorder=3)
        ax.annotate(name, (intensity, achieved / 1e9), xytext=(4, 4), textcoords="offset points", fontsize=9)
    ax.axvline(peak / bandwidth, color="grey", linestyle=":", label=f"ridge {peak / bandwidth:.0f} FLOP/B")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("roofline of this machine, forward passes at batch 64")
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, path)


RECIPE = Recipe(name="hardware", doc=__doc__, order=70, measure=measure, conclude=conclude, add_flags=add_flags,
                uses=("steps", "warmup"), sizes={"steps": (20, 8), "warmup": (2, 1), "stream_mb": (512, 256)})

if __name__ == "__main__":
    sys.exit(RECIPE.main())
