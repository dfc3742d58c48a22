"""The exact offload model (docs/offload.md): its rows (`model`), the copy times in the model's
integer units (`times`) and its solve (`solve`)."""
