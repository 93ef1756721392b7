"""What is particular to each kind: its declaration (``train_job``, ``single_pod``: importing one registers it with
the lifecycle), host ports, the admin's pod policy, the memory plan and training runtimes."""
