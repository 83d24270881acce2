"""The parts of the sidecar's HTTP listener (``runtime/server.py`` puts them together and
routes), one job per module, as exporter-toolkit and client_python split theirs:

- ``framing``: the request as routing sees it, ``Accept-Encoding``, the answer heads (h11 does
  the bytes);
- ``connection``: one client connection (its h11 state machine, caps, timers and state);
- ``auth``: basic authentication, bcrypt on its own thread with its verdicts cached;
- ``ratelimit``: the web configuration's token bucket;
- ``pool``: the threads the event loop hands blocking work to;
- ``bodies``: the ``/metrics`` bodies, one encoding per published state and format.

The listener's own series are a collector like the others: ``collectors/listener.py``.
"""
