"""Launching on a cluster reached over SSH, from a machine that shares nothing with it but the connection
(docs/remote.md).

* ``settings``: ``hydra.launcher.ssh``, validated (the target: host, user, port, key, the remote root);
* ``connection``: one OpenSSH connection per launch (a control master, batch mode), its commands and rsync;
* ``entry``: what runs on the cluster's side (``python -m mmt.remote.entry``): the checks, then the launch itself,
  run there as on the login node by a process that outlives the connection;
* ``launch``: the launcher's side: the code synced once, the jobs handed over, rank 0's lines and the results
  brought back, the connection restored when it goes;
* ``known``: which jobs live on which cluster, for ``mmt list/logs/inspect/wait/stop/delete`` on the launcher's
  machine.
"""
