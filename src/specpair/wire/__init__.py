"""The probability wire: frames, byte format (docs/wire.md), transport and client.

Modules, one job each:

- ``frames``: the in-memory frames (frozen dataclasses).
- ``codec``: the byte format, ``codec.encode`` / ``codec.decode`` (a package: header, body,
  control, propose, proposal, qcheck and the compiled SPARSE checks).
- ``errors``: one exception class per failure, all ``WireError`` (``SpecpairError``).
- ``auth``: pre-shared key and HMAC challenge-response.
- ``server``: the drafter side, ``serve(handler, hello, host, port, key=...)``.
- ``rounds``: how the server feeds a round to its handler: chunks and pieces taken in turn
  with other connections', and each connection's request ids.
- ``source``: the ``DraftSource`` protocol the target side asks drafts of, and ``Missing``
  (with its ``MissingReason``), the one answer for a request without drafts.
- ``conn``, ``client``: the TCP transport, ``DraftClient`` (a ``DraftSource``).
- ``session``: ``DraftSession``, the one target-side owner of what the drafter holds of
  each request (deltas, whole resends, MISSING, REFUSED, counters); the vLLM adapters
  call it.
- ``assemble``: ``to_proposal`` turns a round's drafts into a core ``Proposal``.

The loopback drafter and the wire self-test are test code: tests/wire/wire_loopback.py and
tests/gates/wire_selftest.py.
"""
