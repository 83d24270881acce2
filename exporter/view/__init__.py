"""The live terminal view of one sidecar (``top``) and of the demo: it reads the sidecar's
typed state in process or its /metrics page, and draws it. Not part of the sidecar itself."""
