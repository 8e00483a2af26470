"""Deployment: release files, and `specpair deploy|rollback|restore|gates|release`
driving the Ansible playbooks (playbooks/, roles/, inventories/) through ansible-runner."""
