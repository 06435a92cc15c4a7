"""Job figures kept in the database.

Jobs run in job clusters, possibly on several hosts, and /metrics may be read from any web
server: counters kept in one process would each show a part. So every finished job adds to
one row per task function here (single-statement increments, safe from any number of
clusters at once), and /metrics reads the rows when it is scraped. The rows hold names,
counts and times only.
"""

from __future__ import annotations

from django.db import models

# Upper bounds (seconds) of the job duration histogram; a duration above the last one counts
# only in the total (Prometheus' +Inf bucket).
DURATION_BUCKETS = (0.05, 0.25, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0)


class JobStat(models.Model):
    func = models.CharField(max_length=200, unique=True)
    runs = models.PositiveBigIntegerField(default=0)  # finished, whether they succeeded or failed
    failures = models.PositiveBigIntegerField(default=0)
    seconds = models.FloatField(default=0)  # total running time
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["func"]

    def __str__(self) -> str:
        return self.func


class JobDurationBucket(models.Model):
    """How many runs of `stat` took more than the previous bound and at most `le` seconds."""

    stat = models.ForeignKey(JobStat, on_delete=models.CASCADE, related_name="buckets")
    le = models.FloatField()
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["stat", "le"], name="job_bucket_unique")]
