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

Baseline relies on exactly this. ft_launcher modes restart workers inside the pods first
(launcher --max_restarts) and in-process modes re-enter the train function first; the Job
level then only handles what those cannot: a lost node or an exhausted launcher budget.
"""

from __future__ import annotations

from cdk8s_plus_35 import k8s

from k8s import naming
from k8s.deployment import Deployment

USAGE_ERROR_EXIT_CODE = 2
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"


def backoff_limit(dep: Deployment) -> int:
    return dep.profile.recovery.backoff_limit * dep.profile.node_count


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


def jobset_spec(dep: Deployment, job_spec: dict, labels: dict[str, str]) -> dict:
    """JobSet spec around one Indexed Job (workload: jobset).

    - failurePolicy: any failed child Job restarts all of them at once (a gang restart),
      up to recovery.backoff_limit times; a usage error (the Job's podFailurePolicy FailJob
      on exit 2) fails the JobSet at once instead.
    - network: pod hostnames `<jobset>-node-0-<i>` in the subdomain `<jobset>`, a headless
      Service the controller creates (publishing not-ready pods).
    """
    return {
        "network": {"enableDNSHostnames": True, "subdomain": dep.service_name},
        "failurePolicy": {
            "maxRestarts": dep.profile.recovery.backoff_limit,
            "rules": [{"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}],
        },
        "successPolicy": {"operator": "All"},
        "replicatedJobs": [
            {
                "name": naming.JOBSET_REPLICATED_JOB,
                "replicas": 1,
                "template": {"metadata": {"labels": dict(labels)}, "spec": job_spec},
            }
        ],
    }
