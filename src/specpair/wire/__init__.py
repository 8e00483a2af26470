"""The probability wire: frames, byte format (docs/wire.md), transport and client.

Modules, one job each:

- ``frames``: the in-memory frames (frozen dataclasses).
- ``codec``: the byte format, ``codec.encode`` / ``codec.decode`` (a package: header, body,
  control, propose, proposal, qcheck and the compiled SPARSE checks).
- ``errors``: one exception class per failure, all ``WireError`` (``SpecpairError``).
- ``auth``: pre-shared key and HMAC challenge-response.
- ``server``: the drafter side, ``serve(handler, hello, host, port, key=...)``.
- ``conn``, ``history``, ``client``: the target side, ``DraftClient.propose(items, deadline_s)``.
- ``assemble``: ``to_proposal`` turns a round's answers into a core ``Proposal``.

The loopback drafter and the wire self-test are test code: tests/wire/wire_loopback.py and
tests/gates/wire_selftest.py.
"""
