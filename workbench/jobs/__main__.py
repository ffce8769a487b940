"""`python -m workbench.jobs FOLDER`: a job's supervisor (what `start_job` launches);
`python -m workbench.jobs --worker FOLDER`: the work itself, which the supervisor starts."""

import sys

from workbench.jobs.launch import _worker, main

if sys.argv[1] == "--worker":
    sys.exit(_worker(sys.argv[2]))
sys.exit(main(sys.argv[1]))
