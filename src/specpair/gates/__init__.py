"""Gates: statistical and attestation checks that must pass before serving."""
