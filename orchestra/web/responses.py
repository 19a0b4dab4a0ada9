"""What every success body says (SPEC §1: `"message": "success"`)."""

SUCCESS = "success"
