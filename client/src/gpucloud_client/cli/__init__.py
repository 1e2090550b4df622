"""The `gpc` command line (entry point `gpucloud_client.cli.main:main`), built on the library's clients."""
