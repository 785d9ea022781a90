"""report.html: a self-contained page of an export's verdict (bundle/ writes it, ``cann-export report``
re-derives it): the verdict, fp32 and device metrics per output and shape, the per-layer curve, lint
findings, the ATC command and the capture attempts."""
