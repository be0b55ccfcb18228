"""Turning what a site already records into the simulator's inputs (``gpu-autoscaler trace
import``): Slurm accounting (``sacct --json`` or ``sacct -P``) into a job trace CSV, and a
Prometheus range query or a CSV of pending and running GPUs into a demand series CSV that a
scenario replays directly (``trace.series``; the jobs are inferred when it is replayed, see
``autoscaler/sim/demand_series.py``). docs/trace-import.md gives the commands, the field mapping
and what the inference cannot know.

Every reader here reports a malformed file as one ``InputError`` naming the file, the line and
the field, as the project's YAML and CSV readers do; none imports numpy, so importing works on
the lean install.
"""
