"""Delete: a durable, verifiable erasure of one conversation, leaving a content-free tombstone.

What goes, what stays and why (the registry, lifecycle/registry.py, says it per store):

- Erased: the conversation's turns, messages and tool calls, goals, mail, saved sessions,
  branch journal, checkpoints, pre-import archives and recovery material, runtime claims,
  the process lease, and its engine folders (event log, approval receipts with their lock
  and torn-tail files, artifacts). Gone for good: rows deleted, folders removed.
- Compacted: turn-operation bindings and history-operation receipts keep only operation
  id, target id, time and outcome (their content columns are cleared); the conversation's
  settled rows leave the fleet file (and its legacy copy) under the file's lock, every other
  row staying as it was.
- Kept: the conversation row as a tombstone (public id, owner, scope, raw thread id; the
  title is erased), so lookups keep answering and retries get the same answer; exports (the
  file stays, the link is cut); shared links where the publisher cannot revoke ("shared copy
  remains" is said before confirming); workspace files and memory (untouched, said before
  confirming); usage, billing and audit facts, content-free, until their periods after the
  delete run out; this operation and its receipt.

The lifecycle, in order (DESIGN.md section 4):

1. Admission (`admission.admit`) refuses with one reason code per cause, or finds the
   delete Unavailable (children of unknown ownership, an unreadable fleet file). A refusal
   records no intent and leaves the target writable; only the answer is kept, under the
   operation key.
2. Intent (`lifecycle.actions.request_deletion`): the operation row, its steps, the
   database fence row, the conversation's state (`pending_delete`), the audit fact and the
   erasure job commit in one transaction, before anything is erased. From then on a failure
   means Pending, retried; never success, never writable again.
3. Fence (`lifecycle.fence`): every write path refuses, in the application and in the
   database.
4. Erasure (`executor.run_erasure`) goes store by store in `registry.erasure_order()`.
   Each step measures its records and bytes and commits them before erasing, then erases
   idempotently (delete-if-exists, in batches), then is marked done: a crash at any line
   resumes at the step it stopped in and the receipt stays exact. A lease on the operation
   keeps two workers off the same erasure; the operation counts its own attempts, because
   the job queue does not count a killed worker.
5. Completed: every step done; the title is erased last, the operation keeps the per-store
   receipt (class, records, bytes; no content). Physical erasure is reported apart
   (`physical`): on SQLite `secure_delete` plus a `wal_checkpoint(TRUNCATE)` retried while a
   reader keeps it busy; on PostgreSQL pending until a compaction rewrites every table
   that can hold the conversation's content (`lifecycle.actions.record_compaction`). The
   receipt names what still holds old bytes (earlier backups, a WAL archive) and until when.
6. Recovery (`lifecycle.tasks`): at worker start and every minute, outstanding intents are
   picked up where they stopped.
7. Verification (`verify`): `manage.py verify_erasure` re-scans every registered store, and
   with `--physical` the raw bytes of the database and the engine folder, using keyed
   fingerprints of sampled content windows (`fingerprints`); a clean result is recorded on
   the receipt and the fingerprints are then dropped.
"""
