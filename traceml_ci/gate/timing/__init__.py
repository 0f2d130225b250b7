"""What softens a timed row, in one place: the guards that find a better explanation for a
share or a step time that moved (``guards``: another phase, the sampled modules, contention),
and the sampled modules named beside a share that moved (``modules``). Counts never pass
through here; the re-runs that confirm a timed failure are gate/confirm.py."""
