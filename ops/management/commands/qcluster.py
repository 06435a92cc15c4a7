"""`manage.py qcluster`: django-q2's job cluster, restarted with fresh queues when one of its
processes is killed outright (ops/cluster.py)."""

from __future__ import annotations

import os

from django.conf import settings
from django_q.management.commands import qcluster


class Command(qcluster.Command):
    def handle(self, *args, **options):
        settings.SECRET_KEY  # noqa: B018 (signing needs it: stop here, as django-q2 does)
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        from ops.cluster import Cluster

        cluster = Cluster()
        if options.get("run_once", False):
            cluster.start()
            cluster.stop()
            return
        cluster.run()
