"""How the training Job reacts to a failed pod: the outermost recovery layer, in every mode.

- restartPolicy Never: a failed pod is replaced by a new pod of the same completion index
  (same hostname `<job>-<index>`, so rank 0's DNS name survives), never restarted in place,
  so there is no kubelet CrashLoopBackOff inside a pod.
- Gang restart: when one rank dies, its peers' collectives fail (NCCL error, or the watchdog
  after the NCCL timeout); with TORCH_NCCL_ASYNC_ERROR_HANDLING=3 they exit, their pods fail
  and are replaced as well, and the whole gang meets again at rendezvous on rank 0.
  `backoffLimitPerIndex` is not used: it counts per index, so it
  cannot express "restart the gang N times". The global `backoffLimit` counts failed pods and
  one gang restart fails up to node_count pods, so it is recovery.backoff_limit * node_count.
- podFailurePolicy: a pod evicted or preempted (DisruptionTarget: node drain, node loss,
  spot interruption) is replaced without using the budget; exit code 2 (argparse usage error
  of the launcher) fails the Job at once, since retrying a bad command line cannot help.
- podReplacementPolicy Failed: a replacement starts only once the old pod is gone, so it never
  competes with its predecessor for the node's GPUs (required with a podFailurePolicy).

Baseline and inprocess (torchrun) rely on exactly this. The ft_launcher modes are different:
their launchers restart the workers inside the pods (launcher --max_restarts), a spare pod takes
a lost node's place in the next in-job restart, and the stores live in the store pod. For them:
- podReplacementPolicy TerminatingOrFailed: the lost pod's replacement is created as soon as
  the old pod is marked for deletion (the eviction after the short unreachable toleration),
  not once a dead kubelet's pod is finally gone, which takes until its Node object is deleted.
  The replacement waits Pending for a free node (the Auto Scaling group's replacement
  instance) and joins as the next spare. The scheduler still counts the terminating pod's
  GPUs, so the two never share a node.
- no podFailurePolicy: Kubernetes allows TerminatingOrFailed only without one. What it gave
  is lost: an evicted pod counts against backoffLimit, and an exit code 2 is retried rather
  than failing the Job at once. The budget is per pod (below), and synthesis refuses what the
  launcher and trainer would refuse (exit 2), so a pod's usage error is not expected.
The Job level then only handles what the launchers cannot: a lost node or an exhausted budget.
"""

from __future__ import annotations

from cdk8s_plus_35 import k8s

from k8s import naming
from k8s.deployment import Deployment

USAGE_ERROR_EXIT_CODE = 2
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"


REPLACE_FAILED = "Failed"
REPLACE_TERMINATING = "TerminatingOrFailed"


def backoff_limit(dep: Deployment) -> int:
    return dep.profile.recovery.backoff_limit * dep.pod_count


def replaces_terminating(dep: Deployment) -> bool:
    """A lost pod's replacement starts at once: the modes whose launchers take in a spare."""
    return dep.recovery_mode.launcher_restarts_workers


def pod_replacement_policy(dep: Deployment) -> str:
    return REPLACE_TERMINATING if replaces_terminating(dep) else REPLACE_FAILED


def training_pod_failure_policy(dep: Deployment) -> k8s.PodFailurePolicy | None:
    """The training Job's: none where replacements start at once (Kubernetes refuses the two
    together)."""
    return None if replaces_terminating(dep) else pod_failure_policy()


def pod_failure_policy(container: str = naming.TRAINER_CONTAINER) -> k8s.PodFailurePolicy:
    """Disruptions replace the pod for free; exit code 2 of `container` fails the Job. The
    export Job follows the same two rules (its exit code 2: a damaged checkpoint, bad flags)."""
    # `onPodConditions: []` is required on every rule by the 1.28 API.
    return k8s.PodFailurePolicy(
        rules=[
            k8s.PodFailurePolicyRule(
                action="Ignore",
                on_pod_conditions=[k8s.PodFailurePolicyOnPodConditionsPattern(type="DisruptionTarget", status="True")],
            ),
            k8s.PodFailurePolicyRule(
                action="FailJob",
                on_exit_codes=k8s.PodFailurePolicyOnExitCodesRequirement(
                    container_name=container,
                    operator="In",
                    values=[USAGE_ERROR_EXIT_CODE],
                ),
                on_pod_conditions=[],
            ),
        ]
    )


def jobset_child_backoff_limit(dep: Deployment) -> int:
    """torchrun modes: 0, the first failed pod fails the child Job and the JobSet restarts
    every pod. ft_launcher modes: the Job's own budget, so that a lost pod is replaced within
    the child Job (its spare has already taken over) instead of restarting the whole run."""
    return backoff_limit(dep) if replaces_terminating(dep) else 0


def jobset_spec(dep: Deployment, job_spec: dict, labels: dict[str, str]) -> dict:
    """JobSet spec around one Indexed Job (workload: jobset).

    - failurePolicy: any failed child Job restarts all of them at once (a gang restart),
      up to recovery.backoff_limit times; a usage error (the Job's podFailurePolicy FailJob
      on exit 2) fails the JobSet at once instead, where the Job has that policy.
    - network: pod hostnames `<jobset>-node-0-<i>` in the subdomain `<jobset>`, a headless
      Service the controller creates (publishing not-ready pods).
    """
    failure: dict = {"maxRestarts": dep.profile.recovery.backoff_limit}
    if "podFailurePolicy" in job_spec:
        failure["rules"] = [{"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]
    return {
        "network": {"enableDNSHostnames": True, "subdomain": dep.service_name},
        "failurePolicy": failure,
        "successPolicy": {"operator": "All"},
        "replicatedJobs": [
            {
                "name": naming.JOBSET_REPLICATED_JOB,
                "replicas": 1,
                "template": {"metadata": {"labels": dict(labels)}, "spec": job_spec},
            }
        ],
    }
