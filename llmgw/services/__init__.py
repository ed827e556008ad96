"""Operations that join a fact, a plan and an executor, recording state in the database."""
