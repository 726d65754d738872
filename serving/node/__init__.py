"""Code that runs on the GPU nodes themselves (the fabric all-reduce worker; torch comes with the ``node`` extra)."""
