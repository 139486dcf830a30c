"""Control plane: reconcile loop, decision executor, crash recovery, tenants and auth."""
