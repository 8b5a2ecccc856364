import os

# The Triton checks under interpreted/ run in a child process with TRITON_INTERPRET=1 (test_triton_interpreted.py).
collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["interpreted"]
