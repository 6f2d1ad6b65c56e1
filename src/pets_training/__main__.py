"""``python -m pets_training`` (what ``accelerate launch -m pets_training`` runs): the ``pets-train`` CLI."""

import os
import time

from pets_training.contract import mark_process_start

mark_process_start(os.environ, time.time())  # before the imports: they are part of the start-up

from pets_training.cli import main  # noqa: E402
from pets_training.leave import leave  # noqa: E402

leave(main())
