"""Writing a study file from what the operator already has: a launch command, a systemd unit,
a server log.

`autotune init NAME` (`autotune.cli.init`) calls `study.compose` and `study.write_study`:

* `sources` reads the command: `--from-cmd` text, or a unit's `ExecStart=` with its
  `Environment=`/`EnvironmentFile=` lines; the program part and every flag, in order;
* `flagtable` knows SGLang's flags (its own parser in the study's Python when it imports there,
  else the simulator's table) and turns a log's `server_args=` values back into the flags that
  were given, apart from the values SGLang resolved by itself;
* `fromlog` reads the log: the last start's arguments, its memory ledger, the serving lines;
* `launchflags` spells the flags as SGLang's parser names them and takes the memory settings
  out of them (from the command, else from what the log's start used), dropping the address and
  the API keys;
* `sizing` sizes the search space and the baseline from the current settings and the ledger
  (`autotune.memory.arithmetic`), `traffic` sketches the workload from the serving lines;
* `study` writes it all as TOML with a comment on where each value came from, and validates it
  with `autotune.config.studyfile.load_study` before anything is written.
"""
