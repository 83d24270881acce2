"""Fleet scenarios for judging the alerting pack: scraped series of a fleet of vLLM pods
(``fleet``, ``series``), the named scenarios (``catalog``), and what the pack did on them
(``judge``)."""
