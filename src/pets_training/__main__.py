"""``python -m pets_training`` (what ``accelerate launch -m pets_training`` runs): the ``pets-train`` CLI."""

from pets_training.cli import main
from pets_training.leave import leave

leave(main())
