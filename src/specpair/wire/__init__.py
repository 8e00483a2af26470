"""The probability wire: frames, byte format (docs/wire.md), transport and client.

Modules, one job each:

- ``frames``: the in-memory frames (frozen dataclasses).
- ``format``, ``blocks``, ``codec``, ``codec_propose``, ``codec_proposal``, ``qcheck``:
  the byte format; ``codec.encode`` / ``codec.decode``.
- ``errors``: one exception class per failure, all ``WireError`` (``SpecpairError``).
- ``auth``: pre-shared key and HMAC challenge-response.
- ``server``: the drafter side, ``serve(handler, hello, host, port, key=...)``.
- ``source``: the ``DraftSource`` protocol the target side asks drafts of, and ``Missing``
  (with its ``MissingReason``), the one answer for a request without drafts.
- ``conn``, ``client``: the TCP transport, ``DraftClient`` (a ``DraftSource``).
- ``session``: ``DraftSession``, the one target-side owner of what the drafter holds of
  each request (deltas, whole resends, MISSING, REFUSED, counters); the vLLM adapters
  call it.
- ``assemble``: ``to_proposal`` turns a round's drafts into a core ``Proposal``.
- ``loopback``: a trivial exact drafter for tests, the self-test and the bench.
- ``selftest``: the quick in-image self-test (tests/gates/test_wire_selftest.py).
"""
