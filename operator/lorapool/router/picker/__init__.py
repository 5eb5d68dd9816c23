"""The router's second front door: its policy as a Gateway API Inference Extension endpoint picker.

``lorapool router --ext-proc-port`` serves Envoy's ext_proc protocol beside the HTTP proxy, over
the same scheduler (``protocol`` is the pure message layer, ``service`` the stream, ``server``
the gRPC listeners, ``tls`` the serving certificate, ``endpoints`` URL <-> ip:port).
"""
