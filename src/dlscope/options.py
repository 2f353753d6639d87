"""Typed options: what the CLI parses and the runner hands each step. Torch-free, so the CLI starts fast.

A step's options class is named in its Step; the runner gives every step an instance (defaults
when the command did not set one), so no step reads an argparse Namespace or an untyped bag."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dlscope.errors import ConfigError, require

PIPELINE_FORMATS = ("files", "tfrecord", "array")  # how `dlscope pipeline prepare` lays samples out
TRACE_BACKENDS = ("ebpf", "strace", "proc")  # what `--trace-io` and `dlscope trace` can trace with, best first
OP_SORT_KEYS = ("self_cpu", "cpu_total", "self_device", "device_total", "calls", "flops")  # top-10 table orders
# what the terminal shows of a run: each step's section as the step ends (the built-in job's
# commands); the summary alone once the run ends (`dlscope run`); the summary, then the whole
# report (`dlscope run --verbose`)
TERMINAL_VIEWS = ("sections", "summary", "full")


@dataclass
class RunOptions:
    """Where a run writes and what it watches, shared by every step of one command."""

    out: str | None = None
    data_dir: str | None = None
    tensorboard: bool = True
    progress: bool = True
    terminal: str = "sections"  # one of TERMINAL_VIEWS

    def __post_init__(self) -> None:
        require((self.terminal in TERMINAL_VIEWS, f"terminal view must be one of {', '.join(TERMINAL_VIEWS)}"))


HANG_ACTIONS = ("wait", "end")  # what the watchdog does after its capture


@dataclass
class HangOptions:
    """The hang watchdog (`dlscope run`, and the built-in job's train step): hung when no step
    ends for max(hang_factor × the median step, hang_after seconds); None turns it off."""

    hang_after: float | None = 90.0
    hang_factor: float = 20.0
    on_hang: str = "wait"

    def __post_init__(self) -> None:
        require(
            (self.hang_after is None or self.hang_after > 0, "--hang-after must be > 0 seconds (or off)"),
            (self.hang_factor >= 1, "--hang-factor must be ≥ 1"),
            (self.on_hang in HANG_ACTIONS, f"--on-hang must be one of {', '.join(HANG_ACTIONS)}"),
        )


@dataclass
class TrainOptions:
    resume: str | None = None
    epochs: int | None = None  # --epochs given with --resume: the total to reach (default: the checkpoint's)
    hang: HangOptions = field(default_factory=HangOptions)  # the watchdog of the training


CKPT_FORMATS = ("torch", "dcp")  # torch.save of one file; torch.distributed.checkpoint's directory


@dataclass
class DistOptions:
    """How many processes train the built-in job (torchrun), and how they talk and save."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT of the c10d rendezvous (several nodes)
    max_restarts: int = 0
    bucket_cap_mb: float = 25.0  # DDP's default
    ckpt_format: str = "torch"

    def __post_init__(self) -> None:
        require(
            (self.nproc_per_node >= 1, "--nproc-per-node must be ≥ 1"),
            (self.nnodes >= 1, "--nnodes must be ≥ 1"),
            (0 <= self.node_rank < self.nnodes, "--node-rank must be in [0, --nnodes)"),
            (self.nnodes == 1 or self.rdzv_endpoint is not None, "--nnodes > 1 needs --rdzv-endpoint HOST:PORT"),
            (self.max_restarts >= 0, "--max-restarts must be ≥ 0"),
            (self.bucket_cap_mb > 0, "--bucket-cap-mb must be > 0"),
            (self.ckpt_format in CKPT_FORMATS, f"--ckpt-format must be one of {', '.join(CKPT_FORMATS)}"),
        )
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"--rdzv-endpoint must be HOST:PORT, got {self.rdzv_endpoint!r}")

    def check(self, batch_size: int, autotune: bool) -> None:
        """What the options allow only together with the training config."""
        if batch_size % self.world_size:
            raise ConfigError(
                f"--batch-size {batch_size} is the global batch: it must divide by the {self.world_size} ranks"
            )
        if autotune and self.launched:
            raise ConfigError("--autotune times one process; it cannot be combined with several ranks")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def launched(self) -> bool:
        """Whether training runs in torchrun's worker processes rather than in this one."""
        return self.world_size > 1


@dataclass
class ScalingOptions:
    """The scaling step's short trainings: `steps` global steps per run, configurations interleaved over `rounds`."""

    steps: int = 40
    rounds: int = 3  # the median of three survives one run a neighbour's burst hit

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError("--scaling-steps must be ≥ 1")
        if self.rounds < 2:
            raise ConfigError("--scaling-rounds must be ≥ 2 (rounds alternate the configurations)")


@dataclass
class ProfileOptions:
    wait: int = 1
    warmup: int = 2
    active: int = 5
    sort_by: str = "self_cpu"

    def __post_init__(self) -> None:
        if self.active < 1 or self.wait < 0 or self.warmup < 0:
            raise ConfigError("--profile-steps must be ≥ 1 (and wait/warm-up ≥ 0)")


@dataclass
class SweepOptions:
    """The lab's short sweep by default (≤ 12 s on 2 cores); `dlscope sweep` sets its own."""

    batch_sizes: list[int] = field(default_factory=lambda: [1, 16, 64])
    devices: list[str] | None = None  # every available device
    threads: list[int] | None = None  # torch's current intra-op threads
    cudnn_benchmark: list[bool] = field(default_factory=lambda: [False, True])
    steps: int = 16
    warmup: int = 3
    profile_steps: int = 2
    rounds: int = 4
    gemm_n: int = 1536  # the GEMM-peak matrix size (n × n × n fp32)
    copy_mbytes: int = 64

    def __post_init__(self) -> None:
        if min(self.steps, self.rounds, self.profile_steps) < 1 or self.warmup < 0:
            raise ConfigError("--steps, --rounds and --profile-steps must be ≥ 1, --warmup ≥ 0")
        if self.rounds > self.steps:
            raise ConfigError("--rounds cannot exceed --steps")


@dataclass
class GraphOptions:
    compile: bool = False
    cold: bool = True  # compile into a fresh Inductor cache, so the compile time is the real one
    repeats: int = 20
    batch_size: int | None = None  # default: the training batch size

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError("--repeats must be ≥ 1")


@dataclass
class AnatomyOptions:
    keras_seed: bool = False  # also train seed 003's Keras MLP and dissect its .h5 and .keras
    keras_epochs: int = 1
    keras_train_subset: int | None = None
    keras_backend: str = "torch"  # or "tensorflow" (the tf extra): adds a TF checkpoint
    keras_optimizer: str = "adam"  # the handout's; `ckpt seed003` defaults to rmsprop
    keras_batch_size: int = 32  # Keras's default, as the handout's fit()


@dataclass(frozen=True)
class SweepPlan:
    mnist_samples: int = 5_000
    small_files: int | None = 10_000  # 550-byte files; None: the small-file tables use MNIST files
    compute_ms: float = 5.0  # simulated compute per batch (about 100k samples/s at batch 500)
    model: str = "mlp"  # the training consumer of the batch and shuffle tables
    device: str = "auto"
    threads: int | None = 1  # torch threads of the training consumer: leave the other core to the readers
    seed: int = 0
    batch_size: int = 500  # of every table but the batch-size one
    batch_sizes: tuple[int, ...] = (32, 500, 5000)
    shuffle_buffers: tuple[int, ...] = (0, 500)  # and the whole dataset (a full shuffle)
    workers: tuple[tuple[int, int], ...] = ((0, 0), (0, 2), (2, 2), (4, 2))  # (workers, prefetch)
    training_tables: bool = True
    repeats: int = 3  # each table's rows run round-robin this often; the median wall time is reported
    engines: tuple[str, ...] = ("dlscope",)  # with "tfdata", every TFRecord row also runs through tf.data

    @classmethod
    def short(cls) -> SweepPlan:
        """The lab's default (a few seconds): read buffer, layout, workers and prefetch on 1,500 MNIST files."""
        return cls(
            mnist_samples=1_500,
            small_files=None,
            batch_size=100,
            compute_ms=1.0,  # the same 100k samples/s as 5 ms per 500
            workers=((0, 0), (0, 2), (2, 2)),
            training_tables=False,
            repeats=1,
        )

    def __post_init__(self) -> None:
        if self.mnist_samples < 1 or (self.small_files is not None and self.small_files < 1):
            raise ConfigError("sample counts must be ≥ 1")
        if self.compute_ms < 0:
            raise ConfigError("simulated compute time must be ≥ 0")
        if self.repeats < 1:
            raise ConfigError("repeats must be ≥ 1")
        if not self.engines or set(self.engines) - {"dlscope", "tfdata"}:
            raise ConfigError("engines must be a comma-separated subset of dlscope,tfdata")


@dataclass
class PipelineOptions:
    plan: SweepPlan = field(default_factory=SweepPlan.short)
    remove_data: bool = False


@dataclass
class TraceOptions:
    command: list[str] = field(default_factory=list)
    backend: str = "auto"
    measure_overhead: bool = False
    repeats: int = 3

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError("--repeats must be ≥ 1")


IMPLS = ("loops", "numpy", "im2col", "torch")  # the convolution implementations `ops conv` times


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution: input N×C×H×W, K filters of C×R×S, square stride and zero padding."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: int = 1
    padding: int = 0

    def __post_init__(self) -> None:
        if min(self.n, self.c, self.h, self.w, self.k, self.r, self.s, self.stride) < 1 or self.padding < 0:
            raise ConfigError(f"convolution sizes must be ≥ 1 and padding ≥ 0: {self.describe()}")
        if self.out_h < 1 or self.out_w < 1:
            raise ConfigError(f"the {self.r}×{self.s} filter does not fit the padded {self.h}×{self.w} input")

    @property
    def out_h(self) -> int:
        return (self.h + 2 * self.padding - self.r) // self.stride + 1

    @property
    def out_w(self) -> int:
        return (self.w + 2 * self.padding - self.s) // self.stride + 1

    @property
    def macs(self) -> int:
        """Multiply-adds: one per (output element, input channel, filter tap)."""
        return self.n * self.k * self.out_h * self.out_w * self.c * self.r * self.s

    @property
    def flops(self) -> int:
        """Forward FLOPs as FlopCounterMode counts them: 2 per multiply-add, bias not counted."""
        return 2 * self.macs

    def backward_flops(self, input_grad: bool = True) -> int:
        """Backward FLOPs: the weight gradient, plus the input gradient unless it is the first layer."""
        return self.flops * (2 if input_grad else 1)

    @property
    def im2col_bytes(self) -> int:
        """The float32 patch matrix im2col builds: (N·OH·OW) rows × (C·R·S) columns."""
        return 4 * self.n * self.out_h * self.out_w * self.c * self.r * self.s

    def describe(self) -> str:
        return (
            f"{self.n}×{self.c}×{self.h}×{self.w} * {self.k}×{self.c}×{self.r}×{self.s}"
            f" stride {self.stride} pad {self.padding}"
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "out_h": self.out_h, "out_w": self.out_w, "macs": self.macs, "flops": self.flops}


@dataclass
class OpsOptions:
    parts: tuple[str, ...] = ("conv", "loop_order", "memory")
    shape: ConvShape = field(default_factory=lambda: ConvShape(1, 16, 14, 14, 32, 5, 5, 1, 2))  # cnn's conv2, 1 image
    impls: tuple[str, ...] = IMPLS
    repeats: int = 5
    loops_budget_s: float = 2.0
    loop_order_shape: ConvShape = field(default_factory=lambda: ConvShape(1, 8, 112, 112, 32, 3, 3, 1, 1))
    memory_batch_sizes: list[int] = field(default_factory=lambda: [16, 64])
    gemm_n: int = 1024  # GEMM n for the peak: 1024³ keeps the lab short, `ops conv` uses 2048³


@dataclass
class FileOptions:
    """`ckpt verify|inspect|scan|diff`, `env`, `models`: commands that answer on the terminal, no run directory."""

    paths: list[str] = field(default_factory=list)  # diff: the two to compare
    data_dir: str | None = None  # verify: the MNIST test set
    allow: list[str] = field(default_factory=list)  # scan: globals trusted beyond torch's
    stats: bool = False  # inspect: read every tensor
    json: bool = False
    limit: int = 40  # rows per table


@dataclass
class MnistOptions:
    """`data fetch|verify`: MNIST from a mirror into a cache, or a copy's checksums."""

    mirror: str = ""  # fetch: base URL of the four .gz files
    dest: str | None = None  # fetch: cache root (default ~/.cache/dlscope)
    data_dir: str | None = None  # verify: the copy (default: the embedded one)


@dataclass
class PipelinePrepareOptions:
    """`pipeline prepare`: MNIST's or synthetic samples written in each of `formats`."""

    out: str
    source: str = "mnist"
    samples: int = 60_000
    sample_bytes: int = 472  # synthetic: 550-byte files
    shards: int = 8
    formats: tuple[str, ...] = PIPELINE_FORMATS
    seed: int = 0
    data_dir: str | None = None

    def __post_init__(self) -> None:
        if self.samples < 1 or self.sample_bytes < 1:
            raise ConfigError("--samples and --sample-bytes must be ≥ 1")


@dataclass
class RunDiffOptions:
    """`diff RUN_A RUN_B`: two runs of `dlscope run` compared (dlscope.stages.rundiff)."""

    run_a: str
    run_b: str
    # a part's change under this share of the (slower) step is not called one: on a shared machine,
    # two runs of one configuration made side by side differed by up to 9% in a part (BENCHMARKS.md)
    min_change_pct: float = 10.0
    json: bool = False
    limit: int = 10  # rows per table of operators, system calls, files


@dataclass
class PipelineRunOptions:
    """`pipeline run`: one epoch of one reader configuration, consumed by simulated or real training."""

    data: str
    fmt: str = "tfrecord"
    read_buffer: int = 262_144
    shuffle_buffer: int = 0
    batch_size: int = 500
    workers: int = 0
    prefetch: int = 2
    seed: int = 0
    engine: str = "dlscope"
    warm: bool = False
    compute_ms: float = 5.0
    train: str | None = None  # a model name: train it instead of simulating
    device: str = "auto"
    threads: int | None = None
    epoch: int = 0
    json: bool = False


@dataclass
class StepOptions:
    """Every step's options for one command; a command sets those it changes."""

    train: TrainOptions = field(default_factory=TrainOptions)
    profile: ProfileOptions = field(default_factory=ProfileOptions)
    sweep: SweepOptions = field(default_factory=SweepOptions)
    graph: GraphOptions = field(default_factory=GraphOptions)
    ckpt_anatomy: AnatomyOptions = field(default_factory=AnatomyOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    iotrace: TraceOptions = field(default_factory=TraceOptions)
    dist: DistOptions = field(default_factory=DistOptions)
    scaling: ScalingOptions = field(default_factory=ScalingOptions)
    ops: OpsOptions | None = None  # None: the lab's short defaults
    script: ScriptOptions | None = None  # `dlscope run`'s command and how to observe it
    doctor: DoctorOptions | None = None  # `dlscope doctor`'s command and budget
    merge: MergeOptions | None = None  # `dlscope merge`'s run directories


@dataclass
class MergeOptions:
    """`dlscope merge RUN_DIR...`: the run directories of one job's launchers (or earlier merges)."""

    runs: list[str]
    threads: int | None = None  # DuckDB's (None: every core)

    def __post_init__(self) -> None:
        require(
            (bool(self.runs), "merge needs at least one run directory"),
            (self.threads is None or self.threads >= 1, "--threads must be ≥ 1"),
        )


@dataclass
class DoctorOptions:
    """`dlscope doctor`: the command, the seconds it may take in all, and the trials' shape."""

    command: list[str]
    budget_s: float = 120.0
    warmup_steps: int = 3  # steps of each trial not counted (start-up, workers starting)
    max_steps: int = 40  # counted steps a trial runs at most
    rounds: int = 3  # baseline and candidates interleaved, at most this many times
    extra_env: dict[str, str] = field(default_factory=dict)  # set for the command (tests: PYTHONPATH)

    def __post_init__(self) -> None:
        require(
            (bool(self.command), "doctor needs a command after --"),
            (self.budget_s >= 10, "--budget must be at least 10 seconds"),
            (self.warmup_steps >= 1 and self.max_steps >= 5, "--warmup-steps must be ≥ 1 and --max-steps ≥ 5"),
            (self.rounds >= 1, "--rounds must be ≥ 1"),
        )


@dataclass
class StacksOptions:
    """`dlscope stacks`: a run directory or a PID."""

    target: str
    json: bool = False


@dataclass
class AttachOptions:
    """`dlscope attach`: profile the next `profile_steps` steps of a running job (a run directory or a PID)."""

    target: str
    profile_steps: int
    timeout: float = 600.0  # seconds to wait for the window
    json: bool = False


@dataclass
class WatchOptions:
    """`dlscope watch`: a running job (a run directory or a PID), live on the terminal."""

    target: str
    interval: float = 1.0  # seconds between refreshes
    recent: int = 200  # steps the recent figures are drawn from
    once: bool = False  # one view, then return (scripts, tests)


@dataclass
class ScriptOptions:
    """`dlscope run`: the command to observe and how."""

    command: list[str]
    trace_io: bool = False
    trace_backend: str = "auto"
    profile_steps: int = 5  # active steps; 0: no profiler
    wait: int = 1
    warmup: int = 2
    start_after: int = 1  # steps before the profiler starts: start-up is never profiled
    sort_by: str = "self_cpu"
    tensorboard: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)  # set for the command (tests: PYTHONPATH)
    hang: HangOptions = field(default_factory=HangOptions)
    cwd: str | None = None  # the command's working directory (a doctor trial's scratch); None: dlscope's
    deadline_s: float | None = None  # the command's process group is killed past this many seconds
    output: str | None = None  # the command's stdout and stderr go to this file (None: the terminal's)

    def __post_init__(self) -> None:
        require(
            (self.profile_steps >= 0, "--profile-steps must be ≥ 0"),
            (self.wait >= 0 and self.warmup >= 0, "--wait and --warmup must be ≥ 0"),
            (self.start_after >= 1, "--start-after must be ≥ 1"),
        )
