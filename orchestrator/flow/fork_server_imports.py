"""What the fork server of a LocalCluster's worker processes imports once, before it forks
any worker (task_runners.fork_workers_from_a_warm_server names it in the server's preload
list): TensorFlow, without the Keras it would load eagerly (tf_adapter.import_tensorflow).
Importing this module is its whole purpose."""

from orchestrator.model.tf_adapter import import_tensorflow

import_tensorflow()
