"""A read-only web page of the jobs: phase, progress bar, ETA and curves (``ascend-train dashboard``, and the
operator's dashboard port behind the chart's Service)."""
