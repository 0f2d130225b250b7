"""Framework callbacks: Hugging Face ``Trainer`` (``.hf``) and Lightning (``.lightning``)."""
