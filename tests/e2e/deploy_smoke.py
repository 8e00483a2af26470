"""The deploy's smoke check (roles/specpair_service/tasks/smoke.yml) run by real Ansible,
``ansible-playbook`` on localhost, against a running target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PLAY = """- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: specpair_service
        tasks_from: smoke
    - ansible.builtin.copy:
        content: "{{ specpair_service_smoke | to_json }}"
        dest: "{{ smoke_out }}"
"""


def run_smoke(tmp: Path, url: str, model: str, require_drafts: bool,
              ) -> tuple[int, str, dict | None]:
    """(ansible-playbook's exit code, its output, the smoke fact it recorded or None)."""
    tmp.mkdir(parents=True, exist_ok=True)
    play, out = tmp / "smoke.yml", tmp / "smoke.json"
    play.write_text(PLAY)
    out.unlink(missing_ok=True)
    extra = {"specpair_service_api_url": url, "specpair_service_model": model,
             "specpair_service_smoke_decision_metric": "specpair_chosen_depth_total",
             "specpair_service_smoke_connected_metric": "specpair_drafter_connected",
             "specpair_service_smoke_draft_metric": "vllm:spec_decode_num_draft_tokens_total",
             "specpair_service_smoke_require_drafts": require_drafts, "smoke_out": str(out),
             "ansible_python_interpreter": sys.executable}
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", json.dumps(extra), str(play)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    fact = json.loads(out.read_text()) if out.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, fact
