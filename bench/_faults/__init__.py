"""The fault suite's parts (bench/faults.py runs them; tests/faults/ runs short forms of them).

- `procs`: real processes started in their own process group, killed with SIGKILL as a crash kills them;
- `services`: the shared Postgres and Redis, scratch databases, private Redis and Postgres servers to restart;
- `topology`: the console as it is deployed, embedded (`gpucloud up`) or distributed (web, worker, beat, agents);
- `world`: the tenant, project, quotas and nodes a run needs, and the REST API client that submits its work;
- `truth`: what each workload really does (deterministic output, exit code), and which of its processes run;
- `ledger`: read-only SQL over the console's database (SQLite or Postgres), whatever the code version;
- `observe`: a poller that checks the invariants every second and records when they last started to hold;
- `catalog`: the faults and the settings of a run; `report`: the figures and the table;
- `scenarios`: the runner (`run_fault`), made of `stage` (set up and tear down a run), `drive` (the work and
  the fault) and `measure` (observe until settled, then the figures).
"""
