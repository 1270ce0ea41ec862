"""nvrx-eks: a thin, typed wrapper over kubectl for the training runs of one profile.

Reads the same profile and CDK outputs file as `python -m k8s synth`. `--dry_run` prints the
exact kubectl commands (and, for `synth`, the manifests) without touching a cluster.

    nvrx-eks prepare-data --profile p5          # tokenize C4 onto FSx once
    nvrx-eks submit --profile p5 --mode baseline
    nvrx-eks status --profile p5
    nvrx-eks logs --profile p5 --rank 0 --follow
    nvrx-eks watch --profile p5 --run_id <id>    # step, ETA, failures, goodput, live
    nvrx-eks results --profile p5 --run_id <id>
    nvrx-eks export --profile p5 --run_id <id> --format hf   # to Hugging Face, on FSx
    nvrx-eks stop --profile p5 --run_id <id>
    nvrx-eks lost-node --profile p5 --node <node> # force-delete the pods of a dead node
    nvrx-eks plan --profile p5 --nodes 2,16,128,1024 --step_seconds 1   # capacity at scale
    nvrx-eks plan --profile p5 --nodes 16,256 --spares 1 --failure_rate 0.37  # what spares save
    nvrx-eks cleanup --profile p5               # before `cdk destroy`
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from config import Profile, ProfileError
from config.contract import EXPORT_DTYPE_DEFAULT, EXPORT_DTYPES, EXPORT_FORMATS, export_name
from config.training import settings_lines
from k8s import naming, outputs, synth
from k8s.charts.results import CONTAINER as RESULTS_CONTAINER
from k8s.cli import add_deployment_args, add_image_tag_arg, profile_from_args
from k8s.deployment import Deployment, ExportRequest, check_outputs_match, resolve
from k8s.errors import SynthError
from k8s.image import trainer_image
from k8s.outputs import StackOutputs, default_outputs_path, load_outputs
from scripts import plan as planning
from scripts import spares as sparing
from scripts.kubectl import Kubectl, KubectlFailed, WrapperError

PROG = "nvrx-eks"
PART_OF_SELECTOR = f"{naming.LABEL_PART_OF}={naming.PART_OF}"
TRAIN_SELECTOR = f"{PART_OF_SELECTOR},{naming.LABEL_COMPONENT}={naming.COMPONENT_TRAIN}"
DELETE_TIMEOUT = "15m"
STORE_KINDS = ("deployment", "service", "poddisruptionbudget", "networkpolicy")  # k8s.charts.store
READY_TIMEOUT = "10m"
WAIT_POLL_S = 10.0
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DURATION = re.compile(r"(\d+)([smh])")
# What a run leaves on FSx, copied by `results`: whatever exists of it (results.json appears
# only once training has ended).
RESULT_FILES = ("results.json", "events", "tensorboard", "settings.json", "report")
POD_COLUMNS = ",".join(
    (
        "POD:.metadata.name",
        r"RANK:.metadata.annotations.batch\.kubernetes\.io/job-completion-index",
        "PHASE:.status.phase",
        "EXIT:.status.containerStatuses[0].state.terminated.exitCode",
        "NODE:.spec.nodeName",
        "STARTED:.status.startTime",
    )
)
JOB_COLUMNS = ",".join(
    (
        "JOB:.metadata.name",
        r"MODE:.metadata.labels.nvrx-eks/mode",
        "ACTIVE:.status.active",
        "READY:.status.ready",
        "SUCCEEDED:.status.succeeded",
        "FAILED_PODS:.status.failed",
        "STARTED:.status.startTime",
    )
)


@dataclass
class Session:
    """What every command needs: the profile, the stack outputs and a kubectl for its namespace."""

    args: argparse.Namespace
    profile: Profile
    outputs: StackOutputs
    kubectl: Kubectl

    @property
    def outdir(self) -> Path:
        return self.args.outdir or Path("dist") / self.profile.name

    def deployment(self, run_id: str | None = None, export: ExportRequest = ExportRequest()) -> Deployment:
        return resolve(
            self.profile,
            self.outputs,
            mode=getattr(self.args, "mode", None),
            run_id=run_id or getattr(self.args, "run_id", None),
            export=export,
        )

    def synthesize(self, dep: Deployment, parts: Sequence[str]) -> dict[str, Path]:
        """Write the parts' manifests (under --dry_run: nothing); returns {part: file}."""
        manifests = synth.build(dep, parts)
        if not self.kubectl.dry_run:
            synth.write(manifests, self.outdir)
        return {part: self.outdir / synth.file_name(part, dep.run_id) for part in parts}

    def run_id_or_latest(self) -> str:
        """The given --run_id, else the newest training Job in the namespace (needs the cluster)."""
        if self.args.run_id:
            return checked_run_id(self.args.run_id)
        if self.kubectl.dry_run:
            raise WrapperError("--dry_run cannot look up the latest run: pass --run_id")
        data = json.loads(self.kubectl.query("get", "jobs", "--selector", TRAIN_SELECTOR, "--output", "json"))
        jobs = sorted(data.get("items", []), key=lambda j: j["metadata"]["creationTimestamp"])
        if not jobs:
            raise WrapperError(f"no training runs in namespace {self.profile.namespace!r}")
        return checked_run_id(jobs[-1]["metadata"]["labels"][naming.LABEL_RUN_ID])

    @property
    def monitor_kinds(self) -> tuple[str, ...]:
        """The Prometheus operator's kinds a run has (they exist only with its CRDs)."""
        return ("podmonitors",) if self.profile.observability.pod_monitor else ()

    @property
    def train_kind(self) -> str:
        """The kind of object a run is: an Indexed Job, or a JobSet."""
        return "jobset" if self.profile.workload == "jobset" else "job"


def checked_run_id(run_id: str) -> str:
    """A run id is a DNS label: it becomes object names and label-selector values, so nothing
    else (paths, spaces, commas, flags) may reach kubectl through it."""
    try:
        return naming.validate_run_id(run_id, 1)
    except SynthError as exc:
        raise WrapperError(str(exc)) from None


def seconds(duration: str) -> int:
    """'90s', '15m', '2h' -> seconds; anything else is a one-line error."""
    match = _DURATION.fullmatch(duration)
    if not match:
        raise WrapperError(f"--timeout {duration!r} must be a number with s, m or h, e.g. 2h")
    return int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]


# --- commands ---------------------------------------------------------------------------------


def cmd_synth(s: Session) -> int:
    dep = s.deployment()
    if s.kubectl.dry_run:
        for name, docs in synth.build(dep).items():
            s.kubectl.show(f"# {name}\n{synth.to_yaml(docs)}---")
        return 0
    for path in synth.write(synth.build(dep), s.outdir):
        s.kubectl.show(str(path))
    return 0


def cmd_image(s: Session) -> int:
    """The image reference the manifests use, for `make image` (docker build/push); with
    --nvrx_version, the NVRx release the profile says that image holds (its build argument)."""
    if s.args.nvrx_version:
        s.kubectl.show(s.profile.nvrx_version)
        return 0
    s.kubectl.show(trainer_image(s.profile, s.outputs).reference)
    return 0


def cmd_submit(s: Session) -> int:
    dep = s.deployment()
    files = s.synthesize(dep, (synth.NAMESPACE, synth.COMMON, synth.TRAIN))
    if not dep.namespace_owned_by_stack:
        s.kubectl.run("apply", "--filename", str(files[synth.NAMESPACE]))
    s.kubectl.run("apply", "--filename", str(files[synth.COMMON]), "--filename", str(files[synth.TRAIN]))
    s.kubectl.show(
        f"# run {dep.run_id}: {dep.mode}, {dep.profile.node_count}x {dep.profile.instance_type}, {dep.run_dir}"
    )
    for line in settings_lines(dep.train):
        s.kubectl.show(f"# trainer {line}")
    return 0


def cmd_prepare_data(s: Session) -> int:
    dep = s.deployment()
    files = s.synthesize(dep, (synth.NAMESPACE, synth.COMMON, synth.DATA_PREP))
    if not dep.namespace_owned_by_stack:
        s.kubectl.run("apply", "--filename", str(files[synth.NAMESPACE]))
    # A finished Job's spec is immutable: replace it, so a re-run really prepares again.
    s.kubectl.run("delete", "job", naming.DATA_PREP_JOB, "--ignore-not-found", "--wait=true")
    s.kubectl.run("apply", "--filename", str(files[synth.COMMON]), "--filename", str(files[synth.DATA_PREP]))
    if s.args.wait:
        wait_for_job(s.kubectl, naming.DATA_PREP_JOB, seconds(s.args.timeout))
    return 0


# The Job's pods by state, then its true conditions: "1 0 0 Complete ".
JOB_STATE = (
    '{.status.active}{" "}{.status.succeeded}{" "}{.status.failed}{" "}'
    '{range .status.conditions[?(@.status=="True")]}{.type}{" "}{end}'
)


def job_state(answer: str) -> tuple[str, set[str]]:
    """The Job's state as a line (`1 active, 0 succeeded, 0 failed`) and its true conditions,
    from the JOB_STATE query's answer (kubectl leaves an unset count empty)."""
    fields = answer.split(" ")
    counts = [int(f) if f.isdigit() else 0 for f in (fields + ["", "", ""])[:3]]
    conditions = [f for f in fields[3:] if f]
    line = f"{counts[0]} active, {counts[1]} succeeded, {counts[2]} failed"
    return line + (f" ({', '.join(conditions)})" if conditions else ""), set(conditions)


def wait_for_job(k: Kubectl, name: str, timeout_s: int, poll_s: float = WAIT_POLL_S) -> None:
    """Until the Job is Complete (return) or Failed (one-line error), at most `timeout_s`, with a
    line per poll saying where it is. `kubectl wait` watches one condition only, and would sit
    out the timeout on a failed Job."""
    query = ("get", "job", name, "--output", f"jsonpath={JOB_STATE}")
    if k.dry_run:
        k.show(f"# until Complete or Failed, every {poll_s:g} s for at most {timeout_s} s:")
        k.run(*query)
        return
    start = time.monotonic()
    while True:
        line, conditions = job_state(k.query(*query))
        elapsed = time.monotonic() - start
        stamp = time.strftime("%H:%M:%SZ", time.gmtime())
        k.show(f"# {stamp} Job {name}: {line}, {elapsed:.0f} s of at most {timeout_s} s")
        if "Complete" in conditions:
            return
        if "Failed" in conditions:
            raise WrapperError(f"Job {name!r} failed: see `kubectl --namespace {k.namespace} describe job {name}`")
        if elapsed >= timeout_s:
            raise WrapperError(f"Job {name!r} neither completed nor failed within {timeout_s} s")
        time.sleep(poll_s)


def cmd_status(s: Session) -> int:
    selector = TRAIN_SELECTOR
    if s.args.run_id:
        selector = f"{selector},{naming.LABEL_RUN_ID}={checked_run_id(s.args.run_id)}"
    s.kubectl.run("get", "jobs", "--selector", selector, "--output", f"custom-columns={JOB_COLUMNS}")
    s.kubectl.run(
        "get", "pods", "--selector", selector,
        "--sort-by", ".metadata.creationTimestamp", "--output", f"custom-columns={POD_COLUMNS}",
    )  # fmt: skip
    return 0


def rank_pod_lookup(run_id: str, rank: int) -> list[str]:
    """kubectl args naming the newest pod of one completion index (replacements keep the index)."""
    selector = f"{naming.LABEL_RUN_ID}={run_id},{naming.COMPLETION_INDEX_KEY}={rank}"
    return [
        "get", "pods", "--selector", selector, "--sort-by", ".metadata.creationTimestamp",
        "--output", "jsonpath={.items[-1:].metadata.name}",
    ]  # fmt: skip


def cmd_logs(s: Session) -> int:
    run_id = s.run_id_or_latest()
    if not 0 <= s.args.rank < s.profile.group_size:
        raise WrapperError(f"--rank {s.args.rank} is not a node rank of {s.profile.group_size} nodes "
                           f"({s.profile.node_count} training, {s.profile.spare_nodes} spare)")
    logs = ["logs", "--container", naming.TRAINER_CONTAINER] + (["--follow"] if s.args.follow else [])
    lookup = rank_pod_lookup(run_id, s.args.rank)
    if s.kubectl.dry_run:
        s.kubectl.show(f'{shlex.join(s.kubectl.argv(*logs))} "$({shlex.join(s.kubectl.argv(*lookup))})"')
        return 0
    pod = s.kubectl.query(*lookup).strip()
    if not pod:
        raise WrapperError(f"no pod of rank {s.args.rank} in run {run_id!r} (yet)")
    return s.kubectl.run(*logs, pod, check=False)


def cmd_results(s: Session) -> int:
    """Copy whatever the run has written so far: a running or failed run has no results.json
    yet, but its event log, TensorBoard files and settings."""
    dep = s.deployment(run_id=s.run_id_or_latest())
    pod = naming.results_pod_name(dep.run_id)
    dest = s.args.dest or Path("runs") / dep.run_id
    manifest = s.synthesize(dep, (synth.RESULTS,))[synth.RESULTS]
    s.kubectl.run("apply", "--filename", str(manifest))
    copied = []
    try:
        s.kubectl.run("wait", "--for=condition=Ready", f"pod/{pod}", f"--timeout={READY_TIMEOUT}")
        if not s.kubectl.dry_run:
            dest.mkdir(parents=True, exist_ok=True)
        for name in RESULT_FILES:
            source = f"{pod}:{dep.run_dir}/{name}"
            if s.kubectl.run("cp", "--container", RESULTS_CONTAINER, source, str(dest / name), check=False) == 0:
                copied.append(name)
            else:
                s.kubectl.show(f"# {name} not copied (not written to {dep.run_dir} yet?); skipped")
    finally:
        s.kubectl.run("delete", "pod,networkpolicy", pod, "--ignore-not-found", "--wait=false")
    if not copied and not s.kubectl.dry_run:
        raise WrapperError(f"nothing of run {dep.run_id} in {dep.run_dir}: has it started?")
    if "results.json" in copied or s.kubectl.dry_run:
        report = f"python -m devtools.report {dest}/results.json --out {dest}/report"
        s.kubectl.show(f"# results of {dep.run_id} in {dest}/ (to redo the report: {report})")
    else:
        s.kubectl.show(f"# {', '.join(copied)} of {dep.run_id} in {dest}/; no results.json: training has not "
                       f"ended (its view so far: python -m devtools.watch {dest} --once)")
    return 0


def cmd_watch(s: Session) -> int:
    """The live view of a run (`trainer.telemetry.status`), run in a short-lived pod that reads
    its event log on FSx, refreshed until the run ends; Ctrl-C stops it. The pod goes at the end."""
    if s.args.interval <= 0:
        raise WrapperError(f"--interval {s.args.interval:g} must be positive")
    dep = s.deployment(run_id=s.run_id_or_latest())
    pod = naming.watch_pod_name(dep.run_id)
    manifest = s.synthesize(dep, (synth.WATCH,))[synth.WATCH]
    s.kubectl.run("apply", "--filename", str(manifest))
    view = ["python", "-m", "trainer.telemetry.status", dep.run_dir, "--interval", f"{s.args.interval:g}"]
    tty = ["--tty"] if sys.stdout.isatty() else []  # a terminal is redrawn in place
    try:
        s.kubectl.run("wait", "--for=condition=Ready", f"pod/{pod}", f"--timeout={READY_TIMEOUT}")
        code = s.kubectl.run("exec", *tty, pod, "--container", RESULTS_CONTAINER, "--",
                             *view, *(["--once"] if s.args.once else []), check=False)
    except KeyboardInterrupt:
        code = 130
    finally:
        s.kubectl.run("delete", "pod,networkpolicy", pod, "--ignore-not-found", "--wait=false")
    return code


def cmd_export(s: Session) -> int:
    """Run the export Job (replacing a finished one of the same run and format): the run's
    newest committed checkpoint, or --step, out of the shard format into its export/ directory."""
    request = ExportRequest(s.args.format, s.args.dtype, s.args.step, s.args.optimizer)
    dep = s.deployment(run_id=s.run_id_or_latest(), export=request)
    job = naming.export_job_name(dep.run_id, request.format)
    files = s.synthesize(dep, (synth.NAMESPACE, synth.COMMON, synth.EXPORT))
    if not dep.namespace_owned_by_stack:
        s.kubectl.run("apply", "--filename", str(files[synth.NAMESPACE]))
    s.kubectl.run("delete", "job", job, "--ignore-not-found", "--wait=true")
    s.kubectl.run("apply", "--filename", str(files[synth.COMMON]), "--filename", str(files[synth.EXPORT]))
    if request.step is None:
        which, step = "the newest committed checkpoint", "<N>"
    else:
        which, step = f"step {request.step}", request.step
    target = f"{dep.export_root}/{export_name(request.format, step, request.dtype)}"
    s.kubectl.show(f"# export of {dep.run_id}: {which} as {request.format} {request.dtype}, into {target}")
    if s.args.wait:
        wait_for_job(s.kubectl, job, seconds(s.args.timeout))
    else:
        s.kubectl.show(f"# follow it: {shlex.join(s.kubectl.argv('logs', '--follow', f'job/{job}'))}")
    return 0


def cmd_stop(s: Session) -> int:
    """Delete the run's Job (or JobSet) with foreground cascade, so its pods go first, then its
    Service, ConfigMap and NetworkPolicy, then its store pod's objects; FSx data stays."""
    run_id = s.run_id_or_latest()
    name = naming.train_job_name(run_id)
    s.kubectl.run(
        "delete", s.train_kind, name,
        "--cascade=foreground", "--wait=true", "--ignore-not-found", f"--timeout={DELETE_TIMEOUT}",
    )  # fmt: skip
    s.kubectl.run("delete", ",".join(("service", "configmap", "networkpolicy", *s.monitor_kinds)), name,
                  "--ignore-not-found")
    # the store pod goes after the launchers it served (ft_launcher modes; none elsewhere)
    s.kubectl.run("delete", ",".join(STORE_KINDS), naming.store_name(run_id), "--ignore-not-found")
    s.kubectl.show(f"# stopped {run_id}; its checkpoints and metrics stay in FSx under runs/{run_id}")
    return 0


def cmd_cleanup(s: Session) -> int:
    """Jobs first (foreground: their pods go first), then stray pods, so nothing mounts FSx any
    more when `cdk destroy` deletes the claim and the file system; then the remaining objects.
    The namespace and the FSx PV/PVC belong to the stack and are left to `cdk destroy`."""
    k = s.kubectl
    if s.profile.workload == "jobset":
        k.run("delete", "jobsets", "--selector", PART_OF_SELECTOR, "--cascade=foreground", "--wait=true",
              "--ignore-not-found", f"--timeout={DELETE_TIMEOUT}")
    k.run(
        "delete", "jobs", "--selector", PART_OF_SELECTOR,
        "--cascade=foreground", "--wait=true", "--ignore-not-found", f"--timeout={DELETE_TIMEOUT}",
    )  # fmt: skip
    # the store pods' Deployments and the pre-pull DaemonSet, whose controllers would recreate
    # the pods deleted next
    k.run("delete", "deployments,daemonsets", "--selector", PART_OF_SELECTOR, "--cascade=foreground",
          "--wait=true", "--ignore-not-found", f"--timeout={DELETE_TIMEOUT}")
    k.run(
        "delete",
        "pods",
        "--selector",
        PART_OF_SELECTOR,
        "--wait=true",
        "--ignore-not-found",
        f"--timeout={DELETE_TIMEOUT}",
    )
    k.run(
        "delete",
        ",".join(("networkpolicies", "services", "configmaps", "serviceaccounts", "poddisruptionbudgets",
                  *s.monitor_kinds)),
        "--selector",
        PART_OF_SELECTOR,
        "--ignore-not-found",
    )
    k.show(f"# namespace {s.profile.namespace!r} and the FSx claim are left to `cdk destroy`")
    return 0


def cmd_lost_node(s: Session) -> int:
    """Force-delete our pods bound to a node that is gone. The node lifecycle controller evicts
    them after the toleration (10 s) but cannot finish a deletion the dead kubelet never
    confirms: the old pods stay until the Node object is deleted. The ft_launcher modes'
    replacements start anyway (TerminatingOrFailed); the torchrun modes' wait for this. The
    instance itself is replaced by the node-health agent (infra.constructs.node_health)."""
    node = s.args.node
    if not _NODE_NAME.fullmatch(node):
        raise WrapperError(f"--node {node!r} is not a Kubernetes node name")
    s.kubectl.run(
        "delete", "pods", "--selector", PART_OF_SELECTOR, "--field-selector", f"spec.nodeName={node}",
        "--force", "--grace-period=0", "--ignore-not-found",
    )  # fmt: skip
    s.kubectl.show(f"# pods of node {node} deleted; their Jobs start replacements on healthy nodes")
    return 0


def node_counts(text: "str | None") -> list[int]:
    """`--nodes 16` or `--nodes 2,16,128,1024`; none: the profile's node count."""
    if text is None:
        return []
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise WrapperError(f"--nodes {text!r} must be node counts, e.g. 16 or 2,16,128,1024") from None
    for n in counts:
        if n < 1:
            raise WrapperError(f"--nodes {n} must be at least 1")
    return counts


def cmd_plan(s: Session) -> int:
    nodes = node_counts(s.args.nodes)
    step = s.args.step_seconds
    if step is not None and step <= 0:
        raise WrapperError(f"--step_seconds {step:g} must be positive")
    try:
        the_plan = planning.make_plan(s.profile, nodes, step)
    except ValueError as exc:
        raise WrapperError(f"profile {s.profile.name!r}: {exc}") from None
    lines, warnings = planning.report(the_plan, s.profile.name)
    lines += ["", *sparing.report(spares_plan(s, nodes), planning.LABEL_WIDTH, planning.COLUMN_WIDTH)]
    for line in lines:
        s.kubectl.show(line)
    for warning in warnings:
        s.kubectl.show(f"warning: {warning}")
    return 0


def spares_plan(s: Session, nodes: list[int]) -> sparing.SparesPlan:
    """What the spares cost and save, from --spares, --failure_rate and --node_price."""
    args = s.args
    if args.spares is not None and args.spares < 0:
        raise WrapperError(f"--spares {args.spares} must be 0 or more")
    if args.failure_rate <= 0:
        raise WrapperError(f"--failure_rate {args.failure_rate:g} must be positive (per 1,000 GPU-days)")
    if args.node_price is not None and args.node_price <= 0:
        raise WrapperError(f"--node_price {args.node_price:g} must be positive (USD per node-hour)")
    try:
        return sparing.make_spares_plan(s.profile, nodes, args.spares, args.failure_rate, args.node_price)
    except ValueError as exc:
        raise WrapperError(f"profile {s.profile.name!r}: {exc}") from None


COMMANDS: dict[str, Callable[[Session], int]] = {
    "synth": cmd_synth,
    "image": cmd_image,
    "submit": cmd_submit,
    "prepare-data": cmd_prepare_data,
    "status": cmd_status,
    "logs": cmd_logs,
    "results": cmd_results,
    "watch": cmd_watch,
    "export": cmd_export,
    "stop": cmd_stop,
    "lost-node": cmd_lost_node,
    "plan": cmd_plan,
    "cleanup": cmd_cleanup,
}
# Commands that never talk to the cluster.
LOCAL_COMMANDS = ("synth", "image", "plan")
# Commands that synthesize manifests take the same options as `python -m k8s synth`.
DEPLOYMENT_COMMANDS = ("synth", "submit", "prepare-data", "results", "watch")


# --- argument parsing -------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser, name: str) -> None:
    if name in DEPLOYMENT_COMMANDS:
        add_deployment_args(parser)
    else:
        parser.add_argument("--profile", required=True, help="profile name in config/profiles, or a YAML path")
        parser.add_argument("--outputs", help="CDK outputs file (default: ./cdk-outputs.json when it exists)")
        if name not in ("cleanup", "image", "lost-node", "plan"):
            parser.add_argument("--run_id", help="the run (default: the newest one)")
        if name in ("image", "export"):
            add_image_tag_arg(parser)
    parser.add_argument("--outdir", type=Path, help="manifest directory (default: dist/<profile>)")
    parser.add_argument("--context", help="kube context (default: the current one)")
    parser.add_argument("--dry_run", action="store_true", help="print the kubectl commands instead of running them")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {
        "synth": "write the manifests (--dry_run: print them)",
        "image": "print the trainer image reference (profile image, or ECR repository:tag or :commit)",
        "submit": "synthesize and apply one training run",
        "prepare-data": "run the data-prep Job that writes C4 tokens to FSx",
        "status": "jobs and pods of one run (default: all runs)",
        "logs": "logs of one node rank's newest pod",
        "results": "copy what a run has written off FSx: results.json, events/, tensorboard/, the report",
        "watch": "the live view of a run: step and ETA, tokens/s, failures, goodput; until it ends",
        "export": "export a run's checkpoint as a Hugging Face directory or a PyTorch DCP, on FSx",
        "stop": "delete one run's Job and its pods; FSx data stays",
        "lost-node": "force-delete our pods on a node that is gone, so their Jobs replace them",
        "plan": "per node count: checkpoint sizes, host memory, FSx bandwidth and metadata, storage, recovery times",
        "cleanup": "delete every object of ours, FSx-mounting pods first",
    }
    for name, text in helps.items():
        cmd = sub.add_parser(name, help=text, description=text)
        _common(cmd, name)
        if name in ("prepare-data", "export"):
            cmd.add_argument("--wait", action="store_true", help="wait for the Job to complete")
            cmd.add_argument("--timeout", default="2h", help="how long --wait waits")
        if name == "logs":
            cmd.add_argument("--rank", type=int, default=0, help="node rank (completion index), default 0")
            cmd.add_argument("--follow", "-f", action="store_true")
        if name == "results":
            cmd.add_argument("--dest", type=Path, help="local directory (default: runs/<run-id>)")
        if name == "watch":
            cmd.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes")
            cmd.add_argument("--once", action="store_true", help="show the view once and exit")
        if name == "export":
            cmd.add_argument("--format", required=True, choices=EXPORT_FORMATS,
                             help="hf: safetensors, config and tokenizer; dcp: torch.distributed.checkpoint")
            cmd.add_argument("--step", type=int, help="the checkpoint (default: the newest committed one)")
            cmd.add_argument("--dtype", choices=tuple(EXPORT_DTYPES), default=EXPORT_DTYPE_DEFAULT,
                             help=f"of the weights (default {EXPORT_DTYPE_DEFAULT}: as trained)")
            cmd.add_argument("--optimizer", action="store_true", help="dcp: Adam's state too")
        if name == "image":
            cmd.add_argument("--nvrx_version", action="store_true",
                             help="print the profile's nvrx_version instead: the image's NVRx")
        if name == "lost-node":
            cmd.add_argument("--node", required=True, help="the node's name (kubectl get nodes)")
        if name == "plan":
            cmd.add_argument("--nodes", help="node counts, e.g. 16 or 2,16,128,1024 (default: the profile's)")
            cmd.add_argument("--step_seconds", type=float,
                             help="expected step time: the write bandwidth FSx must sustain")
            cmd.add_argument("--spares", type=int,
                             help="hot spares to price (default: the profile's spare_nodes, else 1)")
            cmd.add_argument("--failure_rate", type=float, default=sparing.DEFAULT_FAILURE_RATE,
                             help="node failures per 1,000 GPU-days (default "
                                  f"{sparing.DEFAULT_FAILURE_RATE:.3f}: Llama 3's 419 interruptions in "
                                  "54 days on 16,384 GPUs, 78 %% hardware)")
            cmd.add_argument("--node_price", type=float,
                             help="USD per node-hour (default: the instance's On-Demand price on record)")
    return parser


def kubeconfig_hint(profile: Profile, out: StackOutputs) -> str:
    cmd = out.get(outputs.KUBECONFIG_COMMAND)
    if cmd:
        return cmd
    cluster = out.get(outputs.CLUSTER_NAME) or "<ClusterName>"
    return f"aws eks update-kubeconfig --name {cluster} --region {profile.region}"


def open_session(args: argparse.Namespace) -> Session:
    profile = profile_from_args(args)
    out = load_outputs(args.outputs or default_outputs_path())
    check_outputs_match(profile, out)
    kubectl = Kubectl(namespace=profile.namespace, context=args.context, dry_run=args.dry_run)
    needs_cluster = not args.dry_run and args.command not in LOCAL_COMMANDS
    if needs_cluster:
        kubectl.preflight(out.get(outputs.CLUSTER_NAME), kubeconfig_hint(profile, out))
    return Session(args, profile, out, kubectl)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](open_session(args))
    except (WrapperError, SynthError, ProfileError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return WrapperError.exit_code
    except KubectlFailed as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.returncode


if __name__ == "__main__":
    sys.exit(main())
